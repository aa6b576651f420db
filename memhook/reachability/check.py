"""The leak check of a live session: valgrind's categories for every block outstanding at that
moment (hook_cpp/reachability/leak_check.h does the work, with the target's threads stopped).
This module says what the native check cannot know: which of the target's mappings are
memhook's own, and whether every block in glibc's heaps is known (the census at attach)."""
from __future__ import annotations

import functools
import os

from .. import _native, allocators, elf, heap_census

CATEGORIES = _native.LEAK_CATEGORIES  # definitely_lost, indirectly_lost, possibly_lost, reachable
DEFAULT_MAX_PAUSE_MS = 200.0


@functools.lru_cache(maxsize=4)
def _extent(path: str) -> int:
    """Bytes from the load base to the end of the last PT_LOAD: the library's data and bss."""
    f, e = elf._open_elf(path)
    with f:
        ends = [s["p_vaddr"] + s["p_memsz"] for s in e.iter_segments() if s["p_type"] == "PT_LOAD"]
    return (max(ends) + 4095) & ~4095


def not_roots(session) -> list[tuple[int, int]]:
    """What is no root beside memhook's segment (which the native side knows by name):
    memhook's hook library, its data and its address table (bss); and glibc malloc's own
    main_arena, whose top and bins point into blocks (heap_census.main_arena)."""
    out = []
    if session.lib_base and getattr(session, "library", ""):
        out.append((session.lib_base, session.lib_base + _extent(session.library)))
    if session.libc_kind[0] == "glibc":
        try:
            arena = heap_census.main_arena(session.pid, session.libc_kind[1])
        except OSError:
            arena = None
        if arena:
            out.append((arena[0], arena[0] + arena[1]))
    return out


def heaps_known(session) -> bool:
    """Every block in glibc's heaps is known: the census at attach found those from before (or
    the program was started under memhook), and no other malloc replaces glibc's."""
    if session.libc_kind[0] != "glibc":
        return False
    if any(f.family == allocators.FAMILIES[0][0] and "malloc" in f.names
           for f in session.allocators if not elf.is_libc(f.path)):
        return False
    at = session.census.get("attach")
    return session.launched or bool(at and not at.get("problem"))


def check(session, max_pause_ms: float = DEFAULT_MAX_PAUSE_MS) -> dict:
    """The check now, as the capture keeps it: per stack, [stack, bytes and blocks for each of
    CATEGORIES], the census's blocks under stack BEFORE_ATTACH; or `skipped` saying why not."""
    known = heaps_known(session)
    skip = not_roots(session)
    r = session.consumer.check_leaks(session.pid, skip, known, max_pause_ms)
    notes = []
    if session.libc_kind[0] == "glibc" and len(skip) < 2:
        notes.append("glibc's main_arena was not found: a block just before a free chunk may "
                     "read as possibly lost (the arena's pointers to chunks point into it)")
    r["heaps_known"] = known
    r["max_pause_ms"] = max_pause_ms
    if not known:
        notes.append("the blocks other allocators (or glibc's, without a census) held before "
                     "attach were scanned as roots: what only they reach counts as reachable")
    if notes:
        r["note"] = "; ".join(notes)
    return r
