"""The leak's own frame (issue 35): of a stack's frames, from the allocation upwards, the first
that is not the runtime's, the frame a person would fix. The runtime is libc, the C++ standard
library and its ABI, libgcc, the dynamic loader, the allocators and memhook, by module (a
shared library's file name) and by function (inlined library code sits in the user's module:
`std::vector<...>::_M_realloc_insert` inlined into the user's function is still the runtime's;
a statically linked allocator's functions, `je_malloc` in the executable, likewise). Both lists
take globs, in the style of pprof's -show_from/-hide: --runtime-module, --runtime-function."""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

RUNTIME_MODULES = (
    "libc.so*", "libc-*.so", "libc.musl*", "ld-linux*", "ld-musl*", "ld-*.so", "libstdc++.so*",
    "libc++.so*", "libc++abi.so*", "libgcc_s.so*", "libm.so*", "libm-*.so", "libpthread*",
    "libdl.so*", "libdl-*.so", "libjemalloc.so*", "libtcmalloc*.so*", "libmimalloc*.so*",
    "libmemhook_hook.so*", "libpython3*.so*")
RUNTIME_FUNCTIONS = (
    "std::*", "__gnu_cxx::*", "__cxxabiv1::*", "__cxa_*", "operator new*", "operator delete*",
    "_IO_*", "__libc_*", "__GI_*", "_dl_*", "__tls_get_addr", "call_init", "_init",
    "malloc", "calloc", "realloc", "reallocarray", "free", "posix_memalign", "aligned_alloc",
    "memalign", "valloc", "pvalloc", "strdup", "strndup", "__strdup", "__strndup", "asprintf",
    "vasprintf", "__vasprintf*", "getline", "getdelim", "__getdelim", "open_memstream",
    "je_*", "_rjem_*", "tc_*", "mi_*", "_mi_*", "tcmalloc::*", "__rust_alloc*",
    "__rust_realloc", "__rdl_*", "__rg_*", "alloc::*", "<alloc::*", "hashbrown::*",
    "memhook_*") + (
    # Allocation wrappers of well-known programs and libraries: the frame a person would fix
    # is their caller (Redis's zmalloc.c, GNU's xmalloc, GLib, nginx's pools, PostgreSQL's
    # memory contexts, SQLite, OpenSSL, MongoDB, CPython's allocator API, ClickHouse).
    "zmalloc*", "zcalloc*", "zrealloc*", "ztrymalloc*", "ztrycalloc*", "ztryrealloc*",
    "zstrdup", "xmalloc", "xcalloc", "xrealloc", "xzalloc", "xstrdup", "xstrndup", "xmemdup*",
    "xnmalloc", "xnrealloc", "x2realloc", "x2nrealloc", "g_malloc*", "g_try_malloc*",
    "g_realloc*", "g_try_realloc*", "g_slice_alloc*", "g_memdup*", "g_strdup", "g_strndup",
    "ngx_alloc", "ngx_calloc", "ngx_memalign", "ngx_palloc*", "ngx_pnalloc", "ngx_pcalloc",
    "ngx_pmemalign", "ngx_create_pool", "palloc", "palloc0", "palloc_extended", "repalloc*",
    "pstrdup", "pnstrdup", "MemoryContextAlloc*", "AllocSetAlloc*", "AllocSetRealloc",
    "AllocSetContextCreate*", "GenerationAlloc*", "SlabAlloc*", "sqlite3Malloc*",
    "sqlite3MemMalloc", "sqlite3MemRealloc", "sqlite3Realloc", "sqlite3DbMalloc*",
    "sqlite3DbRealloc*", "sqlite3_malloc*", "sqlite3_realloc*", "dbMallocRawFinish",
    "CRYPTO_malloc", "CRYPTO_zalloc", "CRYPTO_realloc", "CRYPTO_clear_realloc",
    "CRYPTO_strdup", "CRYPTO_strndup", "CRYPTO_memdup", "mongo::mongoMalloc",
    "mongo::mongoRealloc", "PyMem_Malloc", "PyMem_Calloc", "PyMem_Realloc", "PyMem_Raw*alloc",
    "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyMem_*", "_PyObject_Malloc",
    "_PyObject_Calloc", "_PyObject_Realloc", "pymalloc_*", "Allocator<*>::alloc",
    "Allocator<*>::realloc", "AllocatorWithMemoryTracking<*>::allocate") + (
    # HotSpot's (libjvm.so): its C heap, its arenas and their chunk pool.
    "os::malloc*", "os::realloc", "os::strdup*", "AllocateHeap", "ReallocateHeap",
    "CHeapObj<*>::operator new*", "CHeapObjBase::operator new*", "Arena::grow",
    "Arena::Amalloc*", "Arena::Arena", "Arena::Arealloc", "ChunkPool::allocate*",
    "Chunk::operator new", "ResourceArea::allocate*", "MallocTracker::*")


@dataclass(frozen=True)
class Rules:
    """What counts as the runtime: module globs (matched on a module's file name) and function
    globs (on its demangled name), each list the defaults plus the user's."""
    modules: tuple = RUNTIME_MODULES
    functions: tuple = RUNTIME_FUNCTIONS
    _module_matches: object = field(init=False, repr=False, compare=False)
    _function_matches: object = field(init=False, repr=False, compare=False)
    # (function, module) -> is_runtime: a report asks of the same frames for every stack. Its
    # own dict, not an lru_cache on the method, which hashed the rules' tuples on every call.
    _answers: dict = field(init=False, repr=False, compare=False)
    # id(Python frame dict) -> (the dict, OWN/LIBRARY/MARKER): a Python program's stacks share
    # their frames' dicts (one per frame word) as native stacks share theirs, and 349,000 of
    # them asked the same of 2.3 M frames. (The dict is kept: its id stays its own.)
    _python: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):  # (frozen: one Rules serves as a default everywhere)
        object.__setattr__(self, "_module_matches", glob_matcher(self.modules))
        object.__setattr__(self, "_function_matches", glob_matcher(self.functions))
        object.__setattr__(self, "_answers", {})
        object.__setattr__(self, "_python", {})

    @classmethod
    def with_user(cls, modules=(), functions=()) -> "Rules":
        return cls(RUNTIME_MODULES + tuple(modules), RUNTIME_FUNCTIONS + tuple(functions))

    def is_runtime(self, frame: dict) -> bool:
        key = (frame.get("function") or "", frame.get("module") or "")
        answer = self._answers.get(key)
        if answer is None:
            if len(self._answers) >= 1 << 16:
                self._answers.clear()
            answer = self._answers[key] = self._is_runtime(*key)
        return answer

    def _is_runtime(self, function: str, module: str) -> bool:
        function = qualified_name(function)
        module = os.path.basename(module)
        return bool(module and self._module_matches(module)) or \
            bool(function and self._function_matches(function))


def glob_matcher(globs):
    """A test of a name against fnmatch globs (case-sensitive, the whole name). Most globs are
    a plain name or a prefix and a star: a set and str.startswith answer those, and only the
    rest is compiled to one regular expression (the whole list cost every report 4-8 ms of
    regex compiling at import)."""
    exact, prefixes, rest = set(), [], []
    for g in globs:
        if not any(c in g for c in "*?["):
            exact.add(g)
        elif g.endswith("*") and not any(c in g[:-1] for c in "*?["):
            prefixes.append(g[:-1])
        else:
            rest.append(g)
    rx = re.compile("|".join(fnmatch.translate(g) for g in rest)) if rest else None
    prefixes = tuple(prefixes)

    def matches(name: str) -> bool:
        return name in exact or name.startswith(prefixes) or bool(rx and rx.match(name))
    return matches


DEFAULT = Rules()


OPERATOR_SYMBOLS = sorted(("()", "[]", "->*", "->", "<=>", "<<=", ">>=", "<<", ">>", "<=", ">=",
                           "==", "!=", "&&", "||", "++", "--", "+=", "-=", "*=", "/=", "%=",
                           "&=", "|=", "^=", "<", ">", "=", "!", "+", "-", "*", "/", "%", "&",
                           "|", "^", "~", ","), key=len, reverse=True)


def closing_bracket(text: str, at: int) -> int:
    """The index of the bracket closing the one at `at`, or -1."""
    depth = 0
    for i in range(at, len(text)):
        if text[i] in "<([{":
            depth += 1
        elif text[i] in ">)]}":
            depth -= 1
            if depth == 0:
                return i
    return -1


@lru_cache(maxsize=1 << 16)
def qualified_name(demangled: str) -> str:
    """A demangled function's qualified name, without the return type a template function's
    name begins with or its parameters: `void std::vector<int>::_M_realloc_insert<int>(...)`
    -> `std::vector<int>::_M_realloc_insert<int>`. Brackets are counted, so spaces and
    parentheses inside template arguments and `(anonymous namespace)` stay; an operator's own
    symbol (`operator<`, `operator()`) is not taken for a bracket."""
    depth, start, i, n, after_operator = 0, 0, 0, len(demangled), -1
    while i < n:
        if demangled.startswith("operator", i) and (i == 0 or not (
                demangled[i - 1].isalnum() or demangled[i - 1] == "_")):
            j = i + len("operator")
            if j < n and demangled[j] == " ":  # operator new, operator delete[], operator int
                j += 1
                while j < n and (demangled[j].isalnum() or demangled[j] in "_[]"):
                    j += 1
            else:  # the longest operator symbol; a '<' after it opens template arguments
                j += len(next((t for t in OPERATOR_SYMBOLS if demangled.startswith(t, j)), ""))
            i = after_operator = j
            continue
        c = demangled[i]
        if c == "(" and depth == 0 and i == start and demangled.startswith("(*", i):
            # a function returning a function pointer: R (*NAME(PARAMS))(PARAMS)
            end = closing_bracket(demangled, i)
            return qualified_name(demangled[i + 2:end if end >= 0 else n - 1])
        if c in "<([{":
            if c == "(" and depth == 0 and i > start and not demangled[start:i].endswith("::"):
                return demangled[start:i]
            depth += 1
        elif c in ">)]}":
            depth = max(0, depth - 1)
        elif c == " " and depth == 0 and demangled[i - 1:i] != "," and i != after_operator:
            start = i + 1
        i += 1
    return demangled[start:]


def is_marker(frame: dict) -> bool:
    """A marker memhook puts in a stack ("[no unwind info]"), not a frame of the program's."""
    return not frame.get("module") and (frame.get("function") or "").startswith("[")


# Python's own library: the standard library's files (not the packages installed beside it) and
# the modules frozen into the interpreter.
PYTHON_LIBRARY = re.compile(r"/lib(?:64)?/python3\.\d+t?/(?!(?:site|dist)-packages/)|^<frozen ")


def is_python_library(frame: dict) -> bool:
    return bool(PYTHON_LIBRARY.search(frame.get("file") or ""))


# JIT-compiled code that is the runtime's own (symbolize/jit_frames.py names it): V8's builtins,
# stubs and handlers and Node.js's internal modules; HotSpot's interpreter and stubs and the
# JDK's own methods.
JIT_RUNTIME = re.compile(r"^(?:Builtin:|BytecodeHandler:|Stub:|RegExp:|Handler:|CallIC|LoadIC|"
                         r"StoreIC|KeyedLoadIC|KeyedStoreIC|Interpreter|StubRoutines)")
JIT_RUNTIME_CLASSES = re.compile(r"^(?:java|javax|jdk|sun|com\.sun)\.")  # (HotSpot's names)
JIT_RUNTIME_FILES = re.compile(r"^(?:node:|internal/)")


def is_jit_runtime(frame: dict) -> bool:
    return bool(JIT_RUNTIME.match(frame.get("jit_name") or frame.get("function") or "")
                or JIT_RUNTIME_CLASSES.match(qualified_name(frame.get("function") or ""))
                or JIT_RUNTIME_FILES.match(frame.get("file") or ""))


def attributed(frames: list, rules: Rules = DEFAULT) -> int:
    """The index of the stack's attributed frame: the first, from the allocation upwards, that
    is neither the runtime's nor a marker. A stack wholly in the runtime (a runtime library's
    constructor) is attributed to its first frame. A stack with Python frames is attributed to
    the first of them in the program's own code (not Python's library, nor the runtime by the
    function globs), or else to the first of them; one with JIT-compiled frames, to the first
    of them in the program's own code."""
    own, answers = None, rules._answers
    for i, f in enumerate(frames):  # (a native stack, as most are: one pass, no call a frame)
        if "kind" in f:
            return _attributed_managed(frames, rules)
        if own is None:
            function, module = f.get("function") or "", f.get("module") or ""
            runtime = answers.get((function, module))
            if runtime is None:
                runtime = rules.is_runtime(f)
            if not runtime and (module or not function.startswith("[")):  # (is_marker)
                own = i
    return own or 0


OWN, LIBRARY, MARKER = 0, 1, 2  # what a Python frame is, to attribution


def python_verdict(f: dict, rules: Rules) -> int:
    """A Python frame: the program's own code (OWN), Python's library or the runtime by the
    function globs (LIBRARY), or a marker (MARKER); asked once per frame dict."""
    got = rules._python.get(id(f))
    if got is not None and got[0] is f:
        return got[1]
    verdict = MARKER if is_marker(f) else \
        LIBRARY if is_python_library(f) or rules.is_runtime(f) else OWN
    if len(rules._python) >= 1 << 17:  # (a live session's: what it holds stays bounded)
        rules._python.clear()
    rules._python[id(f)] = (f, verdict)
    return verdict


def _attributed_managed(frames: list, rules: Rules) -> int:
    """attributed(), for a stack with Python or JIT-compiled frames."""
    first_python = None
    for i, f in enumerate(frames):
        if f.get("kind") == "python":
            verdict = python_verdict(f, rules)
            if verdict == OWN:
                return i
            if first_python is None and verdict == LIBRARY:
                first_python = i
    if first_python is not None:
        return first_python
    # A JIT runtime's stack: its first compiled frame of the program's own code.
    own = next((i for i, f in enumerate(frames) if f.get("kind") == "jit" and not is_marker(f)
                and not is_jit_runtime(f) and not rules.is_runtime(f)), None)
    if own is not None:
        return own
    for i, f in enumerate(frames):
        if not is_marker(f) and not rules.is_runtime(f):
            return i
    return 0


def path_into_runtime(frames: list, at: int, shown: int = 2) -> list:
    """The runtime frames the attributed frame called into, at most `shown`, innermost first
    (as stacks are listed): [..., the one it called]."""
    return [f for f in frames[max(0, at - shown):at] if not is_marker(f)]
