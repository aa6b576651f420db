"""Short C++ names for one-line views (issue 35): `std::__cxx11::basic_string<char,
std::char_traits<char>, std::allocator<char> >` reads `std::string`, default allocators,
comparators, hashers and deleters are dropped from template arguments, `std::__cxx11::` and
libc++'s `std::__1::` read `std::`, and a function's parameters and return type are left out
(unless two names of one view would then read the same: Shortener keeps their parameters).
Template arguments are parsed by counting brackets, never by a regular expression over nested
templates. Full names stay in the text's stack listings, the JSON, pprof/OTLP and the HTML
tooltips; --full-names turns this off."""
from __future__ import annotations

import re
from functools import lru_cache

from .attribution import closing_bracket, qualified_name

OPERATOR_THEN_SPACE = re.compile(r"operator[^\w\s]+ $")  # `operator<< <T>`: T's list
NAMESPACES = (("std::__cxx11::", "std::"), ("std::__1::", "std::"), ("std::__debug::", "std::"))
CHAR_TYPES = {"char": "string", "wchar_t": "wstring", "char8_t": "u8string",
              "char16_t": "u16string", "char32_t": "u32string"}
STREAMS = {"std::basic_ostream": "ostream", "std::basic_istream": "istream",
           "std::basic_iostream": "iostream", "std::basic_ostringstream": "ostringstream",
           "std::basic_istringstream": "istringstream", "std::basic_stringstream": "stringstream",
           "std::basic_ofstream": "ofstream", "std::basic_ifstream": "ifstream",
           "std::basic_fstream": "fstream", "std::basic_streambuf": "streambuf",
           "std::basic_string_view": "string_view"}
STREAM_PREFIX = {"char": "", "wchar_t": "w"}
# Template -> how many leading arguments stay when the rest are the defaults DEFAULTS gives.
SEQUENCES = ("std::vector", "std::deque", "std::list", "std::forward_list")
ORDERED = ("std::set", "std::multiset", "std::map", "std::multimap")
UNORDERED = ("std::unordered_set", "std::unordered_multiset", "std::unordered_map",
             "std::unordered_multimap")


def split_args(inner: str) -> list[str]:
    """Template arguments at the top level of `inner` (the text between < and >)."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        if c in "<([{":
            depth += 1
        elif c in ">)]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(inner[start:i].strip())
            start = i + 1
    out.append(inner[start:].strip())
    return [a for a in out if a]


def simplify(text: str) -> str:
    """Every template argument list in `text` simplified, innermost first."""
    for old, new in NAMESPACES:
        text = text.replace(old, new)
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "<" and i and (text[i - 1].isalnum() or text[i - 1] in "_>:" or
                               OPERATOR_THEN_SPACE.search(text[:i])) and \
                not text[:i].endswith("operator") and not text[:i].endswith("operator<"):
            end = closing_bracket(text, i)
            if end < 0:
                out.append(text[i:])
                break
            head = "".join(out)
            name_start = _name_start(head)
            template = head[name_start:]
            args = [simplify(a) for a in split_args(text[i + 1:end])]
            out = [head[:name_start], _template(template, args)]
            i = end + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _name_start(head: str) -> int:
    """Where the (qualified) name that ends `head` begins."""
    depth = 0
    for i in range(len(head) - 1, -1, -1):
        c = head[i]
        if c in ">)]}":
            depth += 1
        elif c in "<([{":
            if depth == 0:
                return i + 1
            depth -= 1
        elif depth == 0 and (c in " ,*&" or (c == ":" and head[i - 1:i] != ":" and
                                             head[i + 1:i + 2] != ":")):
            return i + 1
    return 0


def _template(name: str, args: list[str]) -> str:
    """`name<args...>` with default arguments dropped and well-known aliases used."""
    if name == "std::basic_string" and args and args[0] in CHAR_TYPES and \
            args[1:] in ([], [f"std::char_traits<{args[0]}>"],
                         [f"std::char_traits<{args[0]}>", f"std::allocator<{args[0]}>"]):
        return "std::" + CHAR_TYPES[args[0]]
    if name in STREAMS and args and args[0] in STREAM_PREFIX and \
            args[1:2] in ([], [f"std::char_traits<{args[0]}>"]) and \
            args[2:] in ([], [f"std::allocator<{args[0]}>"]):
        return "std::" + STREAM_PREFIX[args[0]] + STREAMS[name]
    keep = len(args)
    if name in SEQUENCES and len(args) == 2 and args[1] == f"std::allocator<{args[0]}>":
        keep = 1
    elif name in ORDERED:
        key = args[0] if args else ""
        value = args[1] if name.endswith("map") and len(args) > 1 else None
        stored = f"std::pair<{key} const, {value}>" if value is not None else key
        first = 2 if value is not None else 1
        rest = args[first:]
        while rest and rest[-1] in (f"std::allocator<{stored}>",) + \
                ((f"std::less<{key}>",) if len(rest) == 1 else ()):
            rest = rest[:-1]
        keep = first + len(rest)
    elif name in UNORDERED:
        key = args[0] if args else ""
        value = args[1] if name.endswith("map") and len(args) > 1 else None
        stored = f"std::pair<{key} const, {value}>" if value is not None else key
        first = 2 if value is not None else 1
        defaults = [f"std::hash<{key}>", f"std::equal_to<{key}>", f"std::allocator<{stored}>"]
        rest = args[first:]
        if rest == defaults[:len(rest)]:
            rest = []
        keep = first + len(rest)
    elif name == "std::unique_ptr" and len(args) == 2 and \
            args[1] == f"std::default_delete<{args[0]}>":
        keep = 1
    kept = args[:keep]
    return f"{name}<{', '.join(kept)}>" if kept else name


def without_clone(name: str) -> str:
    """GCC's clone suffix (` [clone .constprop.0]`, `.isra.0`) taken off."""
    at = name.find(" [clone ")
    return name[:at] if at >= 0 else name


def without_own_template_arguments(name: str) -> str:
    """A function template's own arguments taken off its last component
    (`std::operator+<char, ...>` -> `std::operator+`, `vector<T>::_M_realloc_insert<T>` ->
    `vector<T>::_M_realloc_insert`); a class's stay."""
    if not name.endswith(">"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += name[i] == ">"
        depth -= name[i] == "<"
        if depth == 0:
            head = name[:i].rstrip()
            # (`operator<` and `operator< <T>`: the operator's own '<' is not a list)
            return head if head and not head.endswith("operator") else name
    return name


@lru_cache(maxsize=1 << 16)  # (a report asks again for each stack a function is in)
def short(name: str, parameters: bool = False) -> str:
    """A demangled function name as one-line views show it."""
    name = without_clone(name)
    if parameters:
        return simplify(name)
    return without_own_template_arguments(simplify(qualified_name(name)))


class Shortener:
    """Short names for one view: two full names that would read the same keep their (short)
    parameters, so that overloads stay apart."""

    def __init__(self, names=(), full: bool = False):
        self.full = full
        by_short: dict = {}
        for n in set(filter(None, names)):
            by_short.setdefault(short(n), set()).add(without_clone(n))
        self.clash = {s for s, fulls in by_short.items() if len(fulls) > 1}

    def __call__(self, name: str | None) -> str | None:
        if not name or self.full:
            return name
        s = short(name)
        return short(name, parameters=True) if s in self.clash else s
