"""The statistics of the allocator, where jemalloc, tcmalloc or mimalloc is it (issue 33, point
3): memhook finds the function that reads them in the module that defines the allocator, and
the hook library reads them inside the target, on a short-lived thread of its own once GDB has
let the process go (hook_cpp/hook_library/allocator_stats.h). What each value means, per
allocator, as its own documentation names it."""
from __future__ import annotations

import time

from elftools.common.exceptions import ELFError

from .. import _native
from ..elf import slots as elf
from ..entry_patch import _symbols

# kind -> the reading function's names (in preference order) and the values it gives, in the
# order allocator_stats.h writes them.
READERS = {
    "jemalloc": (("mallctl", "je_mallctl", "_rjem_mallctl"),
                 ("allocated", "active", "resident", "retained", "mapped", "metadata")),
    "tcmalloc": (("MallocExtension_GetNumericProperty",),
                 ("allocated", "heap_size", "pageheap_free", "pageheap_unmapped",
                  "thread_caches", "central_cache_free")),
    "mimalloc": (("mi_process_info",),
                 ("current_rss", "peak_rss", "current_commit", "peak_commit")),
}
FAMILY_OF = {"jemalloc's API": "jemalloc", "tcmalloc's tc_* API": "tcmalloc",
             "mimalloc's mi_* API": "mimalloc"}
WAIT_S = 2.0  # how long memhook waits for the target's thread to write them


def find(layout) -> tuple | None:
    """(kind, address, module) of the reading function of the allocator the target uses
    besides glibc's malloc (address 0: the allocator is there, its reader is not), or None."""
    missing = None
    for found in layout.allocators:
        kind = FAMILY_OF.get(found.family)
        if kind is None:
            continue
        obj = next((o for o in layout.objects if o.path == found.path), None)
        if obj is None:
            continue
        try:
            f, e = elf._open_elf(obj.file)
        except (OSError, ELFError):
            continue
        with f:
            names = READERS[kind][0]
            addresses, _ = _symbols(e, set(names))
        for name in names:
            if name in addresses:
                return kind, obj.bias + addresses[name][0], found.path
        missing = missing or (kind, 0, found.path)
    return missing


def unreadable(reader: tuple) -> dict:
    kind, _, module = reader
    return {"allocator": kind, "module": module,
            "problem": f"{kind}'s statistics could not be read: {module} defines no "
                       f"{' or '.join(READERS[kind][0])}"}


def wait_for(consumer, reader: tuple | None) -> dict:
    """What the target's thread wrote (after memhook_read_stats), by name; or a problem."""
    if reader is None:
        return {}
    kind, _, module = reader
    states = _native.STATS_STATES
    deadline = time.monotonic() + WAIT_S
    state, values = consumer.allocator_stats()
    while state == states["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
        state, values = consumer.allocator_stats()
    if state != states["done"]:
        why = {states["failed"]: "the target could not start a thread",
               states["running"]: f"its thread did not answer within {WAIT_S:.0f} s",
               states["idle"]: "the reading was not started"}.get(state, "?")
        return {"allocator": kind, "module": module,
                "problem": f"{kind}'s statistics could not be read: {why}"}
    names = READERS[kind][1]
    got = {n: v for n, v in zip(names, values) if v != _native.STATS_NONE}
    if not got:
        return {"allocator": kind, "module": module,
                "problem": f"{kind} gave no statistics (a build without them?)"}
    return {"allocator": kind, "module": module, "values": got}
