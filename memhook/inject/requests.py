"""What a way in is asked to do, whichever way it is (GDB today): load the hook library, start
the session and patch the slots; or put the slots back. Plain data: the GDB agent receives it
as JSON."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import _native
from ..common.arch import HOST


def arch_layout() -> dict:
    """What the agent needs of the target's processor (memhook/common/arch.py)."""
    return {"gdb_sp": HOST.gdb_sp, "gdb_pc": HOST.gdb_pc, "red_zone": HOST.red_zone,
            "stack_align": HOST.stack_align, "syscall_insn": HOST.syscall_insn,
            "syscall_rewound": HOST.syscall_rewound}


def control_layout() -> dict:
    """Where the agent reads what the hook library did with the slots in the target's control
    block, and how a PatchedSlot is laid out (hook_cpp/common/segment.h, through the consumer
    module)."""
    return {"slots_offset": _native.CONTROL_SLOTS_OFFSET,
            "nslots_offset": _native.CONTROL_NSLOTS_OFFSET,
            "late_offset": _native.CONTROL_LATE_OFFSET,
            "nlate_offset": _native.CONTROL_NLATE_OFFSET, "max_slots": _native.MAX_SLOTS,
            "max_late": _native.MAX_LATE_SLOTS, "slot_bytes": _native.SLOT_BYTES,
            "slot_fields": dict(_native.SLOT_FIELDS), "slot_states": dict(_native.SLOT_STATES),
            "mode_off": _native.MODE_OFF,
            "entries_offset": _native.CONTROL_ENTRIES_OFFSET, "entry_bytes": _native.ENTRY_BYTES,
            "entry_state_offset": _native.ENTRY_STATE_OFFSET,
            "entry_states": dict(_native.ENTRY_STATES)}


@dataclass(frozen=True)
class AttachRequest:
    """Load the hook library (unless loaded), start the session, patch the slots."""
    pid: int
    lib_base: int          # an earlier session's hook library in the target, or 0: dlopen it
    library: str           # the library copy, as the target sees its path ("" if loaded)
    segment: str           # the shared segment, as the target sees its path
    symbols: dict          # the hook library's exported symbols: name -> offset
                           # (the slots to patch are planned in the segment: slots.h)
    dlopen: int            # dlopen and dlerror in the target, and dlopen's mode
    dlerror: int
    dlopen_mode: int
    munmap: int            # to unmap what a failed dlopen left of the library (0: unknown)
    malloc: int            # the real malloc: dlopen runs on a thread stopped at its entry
    entry_wait_s: float    # how long to wait for one
    libc_text: list        # [lo, hi]: a thread stopped here may hold an allocator lock
    loader_text: list      # [lo, hi]: likewise, the dynamic loader's
    # musl's loader is its libc: a thread there may hold the loader's lock even after a syscall,
    # unless its signals are not all blocked (musl's dlopen blocks them while it holds the lock)
    loader_blocks_signals: bool = False
    # Entry patches planned in the segment: (address, bytes replaced) each, and the area of
    # their trampolines: one a stopped thread is inside (its pc, or a return address on its
    # stack) is refused before the hook library writes any (hook_library/entry_patches.h).
    entries: list = field(default_factory=list)
    entry_area: list = field(default_factory=list)  # [lo, hi], or [] without entries
    # Start the hook library's thread that reads the allocator's own statistics (jemalloc,
    # tcmalloc, mimalloc: hook_library/allocator_stats.h) once GDB has let the process go.
    read_stats: bool = False
    # A program memhook started, held where its loader is done (inject/startup.py): stopped
    # (SIGSTOP), one thread, no lock held, so dlopen runs on it as it is.
    at_startup: bool = False
    # The program's __lsan_default_suppressions(), called once its work is done: the string it
    # returns is the result's "embedded_suppressions" (0: the program has none)
    embedded_suppressions: int = 0
    layout: dict = field(default_factory=control_layout)
    arch: dict = field(default_factory=arch_layout)
    action: str = "attach"


@dataclass(frozen=True)
class DetachRequest:
    """Turn the hooks into pass-throughs and put back every slot that still holds its hook."""
    pid: int
    lib_base: int
    symbols: dict          # (the slots to restore are in the segment: slots.h)
    read_stats: bool = False  # as AttachRequest's, before the slots are restored
    entries: bool = True      # whether this session planned entry patches (none: no call)
    layout: dict = field(default_factory=control_layout)
    arch: dict = field(default_factory=arch_layout)
    action: str = "detach"


@dataclass(frozen=True)
class TrimRequest:
    """Call malloc_trim(0) in the target (memhook trim), on a thread that holds no allocator
    lock (stopped at malloc's entry, or blocked in the kernel), other threads running."""
    pid: int
    malloc_trim: int
    malloc: int
    entry_wait_s: float
    libc_text: list
    loader_text: list
    loader_blocks_signals: bool = False
    arch: dict = field(default_factory=arch_layout)
    action: str = "trim"
