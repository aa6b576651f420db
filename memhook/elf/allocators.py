"""Allocators besides libc's: which objects of the target define allocation functions, and
whether memhook's hooks reach the calls to them (issue 32, point 1: nothing silently missed).

memhook patches GOT slots. A function an object exports is reached through slots by every other
object, and by the object itself where it calls its own exported functions through its PLT (as
shared libraries do). An executable calls what it defines directly: an allocator linked into it
(jemalloc built into Redis or ClickHouse, tcmalloc into Envoy, Rust's allocator shims) is
reached by entry patches (entry_patch/). A function of a family that memhook has no hook for
(mimalloc's mi_heap_*, mi_strdup) is named as not traced, at attach and in the report.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from . import hooks

_STANDARD_IDS = set(range(1, 31)) | {hooks.BY_SYMBOL["free_sized"].id,
                                     hooks.BY_SYMBOL["free_aligned_sized"].id}
STANDARD = {h.symbol for h in hooks.HOOKS if h.id in _STANDARD_IDS}
JEMALLOC = {"mallocx", "rallocx", "xallocx", "sdallocx", "dallocx"}
# Rust's shims, plain (before Rust 1.79 or so) or v0-mangled in the crate `__rustc`:
# _RNvCs<crate hash>_7___rustc12___rust_alloc is `__rustc::__rust_alloc`.
RUST = re.compile(rb"(?:_RNvCs[0-9A-Za-z_]+_7___rustc[0-9]+_)?"
                  rb"(__rust_(?:alloc|dealloc|realloc|alloc_zeroed))")
FAMILIES = [
    # (family, names, pattern), matched in this order; a name counts once
    ("the malloc family and operator new/delete", STANDARD, None),
    ("jemalloc's API", JEMALLOC | {"je_" + n for n in STANDARD | JEMALLOC if not n[:2] == "_Z"},
     # tikv-jemallocator's prefix (its _rjem_je_* are jemalloc's insides, not its API)
     re.compile(rb"_rjem_(?:malloc|calloc|realloc|free|posix_memalign|aligned_alloc|memalign|"
                rb"valloc|pvalloc|mallocx|rallocx|xallocx|sdallocx|dallocx)")),
    ("tcmalloc's tc_* API", set(), re.compile(rb"tc_(?:malloc|calloc|realloc|free|cfree|new|"
                                              rb"delete|memalign|posix_memalign|valloc|pvalloc)"
                                              rb"[a-z_]*")),
    ("mimalloc's mi_* API", set(), re.compile(rb"mi_(?:malloc|calloc|realloc|zalloc|free|new|"
                                              rb"aligned_alloc|memalign|strn?dup|heap_[a-z]*alloc"
                                              rb"|reallocf|reallocn|reallocarr|reallocarray|"
                                              rb"recalloc|rezalloc|mallocn|expand|realpath)"
                                              rb"[a-z_]*")),
    ("Rust's allocator", set(), RUST),
]
# Names a pattern takes in that only ask about a block (its size, the allocator's statistics).
QUERY = re.compile(r".*(?:usable_size|good_size|malloc_size|_stats|sallocx|nallocx)")
_EXACT = {n for _, names, _ in FAMILIES for n in names}
_PATTERNS = [pattern for _, _, pattern in FAMILIES if pattern is not None]
_PREFIXES = ("_rjem_", "tc_", "mi_", "_RNvCs", "__rust_")  # how the patterns start: a cheap test
# One pass over a string table finds every candidate (a large executable's is tens of MB).
_ANY = re.compile(b"(?:" + b"|".join([re.escape(n.encode()) for n in
                                      sorted(_EXACT, key=len, reverse=True)]
                                     + [p.pattern for p in _PATTERNS]) + b")\0")
# An ELF64 symbol as numpy reads a whole table (elf/slots.py reads .dynsym with the same).
ELF64_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                      ("value", "<u8"), ("size", "<u8")])
STT_FUNC = 2


def hook_of(name: str):
    """The hook (hooks.Hook) for a function of this ELF name, or None: its own name's, or for
    a mangled Rust shim, the plain shim's."""
    h = hooks.BY_SYMBOL.get(name)
    if h is None and name.startswith("_RNvCs"):
        m = RUST.fullmatch(name.encode())
        h = hooks.BY_SYMBOL.get(m.group(1).decode()) if m else None
    return h


def shown(name: str) -> str:
    """A function's name as people read it (a mangled Rust shim by its plain name)."""
    m = RUST.fullmatch(name.encode()) if name.startswith("_RNvCs") else None
    return m.group(1).decode() if m else name


@dataclass
class Found:
    """An object's functions of one family, and how calls reach them."""
    path: str
    family: str
    names: list      # ELF names
    own_calls: bool  # the object's own calls pass through slots (a shared library)
    patched: list = field(default_factory=list)  # entry-patched (entry_patch/)
    refused: list = field(default_factory=list)  # (name, why) not entry-patched

    @property
    def hooked(self) -> list:
        """The names memhook has a hook for."""
        return [n for n in self.names if hook_of(n) is not None]

    @property
    def unhooked(self) -> list:
        return [n for n in self.names if hook_of(n) is None]

    def line(self) -> str:
        where = f"{self.family} defined in {self.path}"
        missing = (f"; no hook for {_some(self.unhooked)}, so calls to them are not traced"
                   if self.unhooked else "")
        if not self.hooked:
            return f"{where} ({_some(self.names)}): not traced (memhook has no hook for them)"
        if self.own_calls:
            return f"{where} ({_some(self.hooked)}): traced through slots{missing}"
        if self.patched:
            patched = [n for n in self.names if n in self.patched]  # (in hooks.def's order)
            return (f"{where}: entry-patched ({_some(patched)})"
                    + (f"; not patched, so its own calls to them are not traced: "
                       f"{_some([n for n, _ in self.refused])}" if self.refused else "")
                    + missing)
        return (f"{where} ({_some(self.hooked)}): its own calls reach no slot and are not "
                f"traced (only calls from other objects are){missing}")

    @property
    def traced(self) -> str:
        """"yes", "partly" (some functions not patched or not hooked), "from other objects
        only", or "no"."""
        if not self.hooked:
            return "no"
        if (self.own_calls or (self.patched and not self.refused)) and not self.unhooked:
            return "yes"
        return "partly" if self.patched or self.own_calls else "from other objects only"


def _some(names: list) -> str:
    names = [shown(n) for n in names]
    return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")


def candidate(name: str) -> bool:
    """Whether a function of this name belongs to a family."""
    if QUERY.fullmatch(name):
        return False
    return name in _EXACT or (name.startswith(_PREFIXES)
                              and any(p.fullmatch(name.encode()) for p in _PATTERNS))


def _symtab_names(elf) -> set:
    """Names of the functions an executable's full symbol table defines, among those any family
    could hold (matched on the string table, not symbol by symbol: an executable may have a
    million symbols). Its direct calls reach these; a stripped one has none."""
    sec = elf.get_section_by_name(".symtab")
    if sec is None or sec["sh_entsize"] != ELF64_SYM.itemsize:
        return set()
    strtab = elf.get_section(sec["sh_link"]).data()
    offsets = {}
    for m in _ANY.finditer(strtab):
        # Linkers share tails ("malloc" may be the end of "je_malloc"): every suffix that is a
        # candidate itself is one too.
        for k in range(m.start(), m.end() - 1):
            tail = strtab[k:m.end() - 1].decode(errors="replace")
            if candidate(tail):
                offsets[k] = tail
    if not offsets:
        return set()
    syms = np.frombuffer(sec.data(), dtype=ELF64_SYM)
    keep = np.isin(syms["name"], np.fromiter(offsets, dtype=np.uint32)) & (
        syms["shndx"] != 0) & ((syms["info"] & 0xF) == STT_FUNC)
    return {offsets[int(o)] for o in syms["name"][keep]}


def find(path: str, elf, exported: set, executable: bool) -> list:
    """What an object (mapped as `path`) defines of each family: `exported`, from its dynamic
    symbol table (the scan's), and for an executable its full symbol table's too."""
    names = set(exported) | (_symtab_names(elf) if executable else set())
    found = []
    for family, members, pattern in FAMILIES:
        mine = sorted((n for n in names if candidate(n) and (n in members or (
            pattern is not None and pattern.fullmatch(n.encode())))),
            key=lambda n: (hook_of(n).id if hook_of(n) else 1000, n))  # as hooks.def orders
        names -= set(mine)
        if mine:
            found.append(Found(path, family, mine, own_calls=not executable))
    return found
