"""Running the GDB agent against the target: batch mode, no init files, no symbols, no debuginfod,
no libthread_db, so the target is stopped for as short a time as possible.

What GDB does while the target is stopped is what the target waits for. GDB reads the executable
when it attaches, and always reads the minimal symbols of libc (for thread debugging), with any
separate debug file a -dbg package installed: 10-80 ms on real programs. So the agent loads the
executable before it attaches (GDB's infcalls return through its entry point), and GDB's sysroot
is an empty directory of memhook's, so GDB opens no shared library at all: it needs none, every
address it is given was computed by memhook from the ELF files."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import resources

from . import _native
from .procfs import TargetError

GDB_TIMEOUT_S = 120
MARKER = "MEMHOOK_RESULT "

GDB_SETTINGS = [
    "set pagination off",
    "set confirm off",
    "set auto-load off",
    "set auto-solib-add off",
    "set debuginfod enabled off",
    "set libthread-db-search-path",
    "set print thread-events off",
    "set print inferior-events off",
    "set debug-file-directory",
    "set exec-file-mismatch off",  # the executable is read as /proc/PID/exe, before the attach
]


def control_layout() -> dict:
    """Where the agent finds the patched slots in the target's control block, and how a
    PatchedSlot is laid out (hook_cpp/common/segment.h, through the consumer module)."""
    return {"slots_offset": _native.CONTROL_SLOTS_OFFSET,
            "nslots_offset": _native.CONTROL_NSLOTS_OFFSET,
            "late_offset": _native.CONTROL_LATE_OFFSET,
            "nlate_offset": _native.CONTROL_NLATE_OFFSET, "max_slots": _native.MAX_SLOTS,
            "max_late": _native.MAX_LATE_SLOTS, "slot_bytes": _native.SLOT_BYTES,
            "slot_fields": dict(_native.SLOT_FIELDS), "slot_patched": _native.SLOT_PATCHED,
            "mode_off": _native.MODE_OFF}


@dataclass(frozen=True)
class AttachRequest:
    """Load the hook library (unless loaded), start the session, patch the slots."""
    pid: int
    lib_base: int          # an earlier session's hook library in the target, or 0: dlopen it
    library: str           # the library copy, as the target sees its path ("" if loaded)
    segment: str           # the shared segment, as the target sees its path
    symbols: dict          # the hook library's exported symbols: name -> offset
    slots: list            # per slot: [address, entry offset, real function, PLT ranges,
                           #            hook id, in a RELRO page]
    dlopen: int            # dlopen and dlerror in the target, and dlopen's mode
    dlerror: int
    dlopen_mode: int
    munmap: int            # to unmap what a failed dlopen left of the library (0: unknown)
    malloc: int            # the real malloc: dlopen runs on a thread stopped at its entry
    entry_wait_s: float    # how long to wait for one
    libc_text: list        # [lo, hi]: a thread stopped here may hold an allocator lock
    loader_text: list      # [lo, hi]: likewise, the dynamic loader's
    layout: dict = field(default_factory=control_layout)
    action: str = "attach"


@dataclass(frozen=True)
class DetachRequest:
    """Turn the hooks into pass-throughs and put back every slot that still holds its hook."""
    pid: int
    lib_base: int
    symbols: dict
    slots: list            # [address, original, hook] as the attach patched them
    layout: dict = field(default_factory=control_layout)
    action: str = "detach"


def find_gdb() -> str:
    gdb = shutil.which("gdb")
    if gdb is None:
        raise TargetError("gdb is not installed: install it (Debian/Ubuntu: apt-get install gdb; "
                          "Fedora/RHEL: dnf install gdb)")
    return gdb


def run_agent(request: AttachRequest | DetachRequest) -> dict:
    """Run the agent on `request`; return what it reported. Raises TargetError on failure."""
    params = asdict(request)
    gdb = find_gdb()
    body = resources.files("memhook").joinpath("gdb_agent.py").read_text()
    with tempfile.TemporaryDirectory(prefix="memhook-gdb-") as tmp:  # 0700, root's
        script = os.path.join(tmp, "agent.py")
        with open(script, "w") as f:
            f.write(f"import json\nPARAMS = json.loads({json.dumps(params)!r})\n" + body)
        sysroot = os.path.join(tmp, "sysroot")  # empty: GDB finds no shared library to read
        os.mkdir(sysroot, 0o700)
        cmd = [gdb, "-nx", "-nh", "-q", "-batch", "--readnever"]
        for s in GDB_SETTINGS + [f"set sysroot {sysroot}"]:
            cmd += ["-iex", s]
        cmd += ["-x", script]
        # GDB may be inside a call in the target: neither a terminal's Ctrl-C (own session) nor
        # one aimed at memhook (signals held until GDB is done) may cut it short.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=GDB_TIMEOUT_S, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise TargetError(f"gdb did not finish within {GDB_TIMEOUT_S} s") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if "ptrace" in proc.stderr and ("not permitted" in proc.stderr or "Operation" in proc.stderr):
        raise TargetError("gdb may not trace the target (ptrace: operation not permitted): run as "
                          "root, or relax kernel.yama.ptrace_scope")
    if "Python scripting is not supported" in proc.stderr:
        raise TargetError("this gdb was built without Python support, which memhook needs")
    raise TargetError(f"gdb failed: {detail}")
