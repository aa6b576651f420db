"""The leak check of a live session: valgrind's categories for every block outstanding at that
moment (hook_cpp/reachability/leak_check.h does the work, with the target's threads stopped).
This module says what the native check cannot know: which of the target's mappings are
memhook's own, and whether every block in glibc's heaps is known (the census at attach)."""
from __future__ import annotations

import functools

from ..common import procfs
from ..consumer import heap_census
from ..elf import slots as elf


@functools.lru_cache(maxsize=4)
def _extent(path: str) -> int:
    """Bytes from the load base to the end of the last PT_LOAD: the library's data and bss."""
    f, e = elf._open_elf(path)
    with f:
        ends = [s["p_vaddr"] + s["p_memsz"] for s in e.iter_segments() if s["p_type"] == "PT_LOAD"]
    return (max(ends) + elf.PAGE - 1) & ~(elf.PAGE - 1)


def memhooks_own(session) -> list[tuple[int, int]]:
    """memhook's memory in the target beside its segment (which the native side knows by name):
    the hook library, its data and its address table (bss)."""
    if not session.lib_base or not getattr(session, "library", ""):
        return []
    return [(session.lib_base, session.lib_base + _extent(session.library))]


def glibc_main_arena(session) -> list[tuple[int, int]]:
    """glibc malloc's main_arena, whose top and bins point into blocks (heap_census.main_arena):
    no root. Empty where it is not found (or the libc is not glibc)."""
    if session.libc_kind[0] != "glibc":
        return []
    try:
        arena = heap_census.main_arena(session.pid, session.libc_kind[1])
    except OSError:
        return []
    return [(arena[0], arena[0] + arena[1])] if arena else []


def heaps_known(session) -> bool:
    """Every block in glibc's heaps is known: the census at attach found those from before (or
    the program was started under memhook), and no other malloc replaces glibc's."""
    if session.libc_kind[0] != "glibc" or session.malloc_beside_glibc() is not None:
        return False
    at = session.census.get("attach")
    return session.launched or bool(at and not at.get("problem"))


# The copy's pause grows with the memory the target has resident (its page tables copied):
# about 13-18 ms per GiB of heap here (benchmarks/leak_check.py), a scan with every thread stopped
# about 50 times that. Where the copy's alone would pass --max-pause, no check is taken.
COPY_MS_PER_GIB = 20.0


def too_big(session, status: dict) -> str:
    """Why no check can stay within --max-pause, or ''. `status`: procfs.status()."""
    try:
        rss = int(status.get("VmRSS", "0 kB").split()[0]) * 1024
    except (ValueError, IndexError):
        rss = 0
    ms = rss / 2**30 * COPY_MS_PER_GIB
    if ms <= session.options.max_pause_ms:
        return ""
    return (f"even the copy of its {rss / 2**30:.1f} GiB would pause the target about "
            f"{ms:.0f} ms, beyond --max-pause ({session.options.max_pause_ms:g} ms)")


def fork_stub(session, status: dict) -> tuple[int, str]:
    """Where the check has the target copy itself (the hook library's syscall stub: the scan
    then reads the copy while the target runs on, reachability/forked_image.h), or 0 and why
    the target is read stopped instead: --check-by stop, or a seccomp filter (a clone() it
    forbids could kill the process). The copy's pause is the shorter even for small programs
    (0.3 ms against 1.7 ms for a 3 MiB one, 19 ms against 978 ms for 1 GiB of 1 KiB blocks:
    benchmarks/leak_check.py), so it is the default."""
    if session.options.check_by == "stop" or not session.lib_base or \
            not getattr(session, "library", "") or not status:
        return 0, ""
    if status.get("Seccomp", "0") != "0":
        return 0, "a seccomp filter: the target is not made to clone itself"
    offset = elf.exported_offsets(session.library).get("memhook_syscall_stub")
    return (session.lib_base + offset, "") if offset else (0, "")


def check(session) -> dict:
    """The check now, within the session's --max-pause, as the capture keeps it: per stack,
    [stack, bytes and blocks for each category], the census's blocks under stack BEFORE_ATTACH;
    or `skipped` saying why not."""
    known = heaps_known(session)
    arena = glibc_main_arena(session)
    max_pause_ms = session.options.max_pause_ms
    try:
        status = procfs.status(session.pid)  # (one read for both)
    except OSError:
        status = {}
    big = too_big(session, status)
    if big:
        return {"skipped": big, "heaps_known": known, "max_pause_ms": max_pause_ms}
    stub, why_not = fork_stub(session, status)
    r = session.consumer.check_leaks(session.pid, memhooks_own(session) + arena, known,
                                     max_pause_ms, stub)
    notes = [f"read stopped: {why_not}"] if why_not else []
    if r.get("fork_failed"):
        notes.append(f"no copy of the target to read ({r['fork_failed']}): read stopped")
    if r.get("not_reaped"):
        notes.append("the target's copy could not be reaped by it: a zombie of its until it "
                     "ends (its wait(-1) never sees it)")
    if session.libc_kind[0] == "glibc" and not arena:
        notes.append("glibc's main_arena was not found: a block just before a free chunk may "
                     "read as possibly lost (the arena's pointers to chunks point into it)")
    names = (session.census.get("attach") or {}).get("type_names") or [""]
    r["before_attach_lost"] = [
        {"category": k, "size": usable, "type": names[t] if t < len(names) else "",
         "blocks": n, "bytes": b} for k, usable, t, n, b in r.get("before_attach_lost", ())]
    r["heaps_known"] = known
    r["max_pause_ms"] = max_pause_ms
    if not known:
        notes.append("the blocks other allocators (or glibc's, without a census) held before "
                     "attach were scanned as roots: what only they reach counts as reachable")
    if notes:
        r["note"] = "; ".join(notes)
    return r
