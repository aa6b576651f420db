"""Allocators besides libc's: which objects of the target define allocation functions, and
whether memhook's slots reach the calls to them (issue 32, point 1: nothing silently missed).

memhook patches GOT slots. A function an object exports is reached through slots by every other
object, and by the object itself where it calls its own exported functions through its PLT (as
shared libraries do). An executable calls what it defines directly: an allocator linked into it
(jemalloc built into Redis or ClickHouse, tcmalloc into Envoy) is called without any slot, so
its own allocations are not traced. APIs other than the standard names (jemalloc's mallocx,
tcmalloc's tc_*, mimalloc's mi_*) are not hooked at all yet. Both are said at attach and in the
report.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from . import hooks

# Each family: the exact names that belong to it, or a pattern of names.
STANDARD = {h.symbol for h in hooks.HOOKS if h.kind in "AFR"} | {"malloc_usable_size"}
JEMALLOC = {"mallocx", "rallocx", "xallocx", "sdallocx", "dallocx", "nallocx", "sallocx"}
FAMILIES = [
    # (family, names, pattern), matched in this order; a name counts once
    ("the malloc family and operator new/delete", STANDARD, None),
    ("jemalloc's API", JEMALLOC | {"je_" + n for n in STANDARD | JEMALLOC if not n[:2] == "_Z"},
     re.compile(rb"_rjem_[a-z_]+")),  # tikv-jemallocator's prefix
    ("tcmalloc's tc_* API", set(), re.compile(rb"tc_(?:malloc|calloc|realloc|free|new|delete|"
                                              rb"memalign|posix_memalign|valloc|pvalloc)"
                                              rb"[a-z_]*")),
    ("mimalloc's mi_* API", set(), re.compile(rb"mi_(?:malloc|calloc|realloc|zalloc|free|"
                                              rb"new|aligned_alloc|memalign|strdup|heap_malloc)"
                                              rb"[a-z_]*")),
]
_EXACT = {n for _, names, _ in FAMILIES for n in names}
_PATTERNS = [pattern for _, _, pattern in FAMILIES if pattern is not None]
_PREFIXES = ("_rjem_", "tc_", "mi_")  # how each pattern starts: a cheap test first
# One pass over a string table finds every candidate (a large executable's is tens of MB).
_ANY = re.compile(b"(?:" + b"|".join([re.escape(n.encode()) for n in
                                      sorted(_EXACT, key=len, reverse=True)]
                                     + [p.pattern for p in _PATTERNS]) + b")\0")
# An ELF64 symbol as numpy reads a whole table (elf.py reads .dynsym with the same).
ELF64_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                      ("value", "<u8"), ("size", "<u8")])
STT_FUNC = 2


@dataclass
class Found:
    """An object's functions of one family, and how calls reach them."""
    path: str
    family: str
    names: list
    hooked: bool     # memhook hooks these names (else nothing of the family is traced)
    own_calls: bool  # the object's own calls pass through slots (a shared library)
    patched: list = field(default_factory=list)  # entry-patched (entry_patch.py)
    refused: list = field(default_factory=list)  # (name, why) not entry-patched

    def line(self) -> str:
        names = _some(self.names)
        if not self.hooked:
            return (f"{self.family} defined in {self.path} ({names}): not traced (memhook hooks "
                    "the standard names only)")
        if self.own_calls:
            return f"{self.family} defined in {self.path} ({names}): traced through slots"
        if self.patched:
            return (f"{self.family} defined in {self.path}: entry-patched ({_some(self.patched)})"
                    + (f"; not patched, so its own calls to them are not traced: "
                       f"{_some([n for n, _ in self.refused])}" if self.refused else ""))
        return (f"{self.family} defined in {self.path} ({names}): its own calls reach no slot "
                "and are not traced (only calls from other objects are)")

    @property
    def traced(self) -> str:
        """"yes", "partly" (some entries not patched), "from other objects only", or "no"."""
        if not self.hooked:
            return "no"
        if self.own_calls or (self.patched and not self.refused):
            return "yes"
        return "partly" if self.patched else "from other objects only"


def _some(names: list) -> str:
    return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")


def candidate(name: str) -> bool:
    """Whether a function of this name belongs to a family."""
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
        mine = sorted((n for n in names if n in members
                       or (pattern is not None and pattern.fullmatch(n.encode()))),
                      key=lambda n: (n.startswith("_Z"), n))  # C names first
        names -= set(mine)
        if mine:
            found.append(Found(path, family, mine, hooked=members is STANDARD,
                               own_calls=not executable))
    return found
