"""`memhook snapshot PID`: ask the memhook that traces PID (or memhook itself, by its own PID)
for a snapshot now: SIGUSR1 to that memhook, which writes it into its capture at once, prints
it, and traces on (commands/driver.py; capture/snapshots.py)."""
from __future__ import annotations

import os
import signal

from ..common import procfs
from ..common.procfs import TargetError
from ..consumer.session import owning_memhook
from ..elf import slots as elf
from .arguments import Parser, pid_arg


def snapshot_parser() -> Parser:
    p = Parser(prog="memhook snapshot", usage="PID", page="docs/leak-analysis.md", description="Ask a running memhook for a snapshot: "
               "the aggregates now, written into its capture and printed; tracing goes on.")
    p.add_argument("pid", type=pid_arg, metavar="PID",
                   help="the traced process, or the memhook tracing it")
    return p


def is_memhook(pid: int) -> bool:
    """A memhook process: its command is memhook's script, or python -m memhook."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return os.path.basename(argv[0]) == b"memhook" or argv[1:3] == [b"-m", b"memhook"] or \
        (len(argv) > 1 and os.path.basename(argv[1]) == b"memhook")


def tracing_memhook(pid: int) -> int:
    """The memhook whose session is armed in `pid`, or 0."""
    lib = next((m for m in procfs.read_maps(pid) if m.offset == 0 and
                os.path.basename(m.path.replace(" (deleted)", "")) == elf.HOOK_LIBRARY_NAME),
               None)
    if lib is None:
        return 0
    return owning_memhook(pid, lib.start, f"/proc/{pid}/map_files/{lib.start:x}-{lib.end:x}")


def run_snapshot(argv: list[str]) -> int:
    a = snapshot_parser().parse_args(argv)
    procfs.process_info(a.pid)  # (one line if there is no such process, or it is not ours)
    owner = a.pid if is_memhook(a.pid) else tracing_memhook(a.pid)
    if not owner:
        raise TargetError(f"no memhook is tracing PID {a.pid}")
    os.kill(owner, signal.SIGUSR1)
    print(f"memhook: asked memhook (PID {owner}) for a snapshot"
          + (f" of PID {a.pid}" if owner != a.pid else "") + "; it prints it and writes it "
          "into its capture")
    return 0
