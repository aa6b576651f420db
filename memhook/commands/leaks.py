"""`memhook leaks -p PID`: which blocks no pointer reaches in a running process, now, as macOS's
`leaks PID` answers and LeakSanitizer at exit: attach, trace for --duration (default: none), the
leak check, detach. Lost blocks allocated while traced come by stack; those from before attach
(the heap census's, glibc) by size and C++ type. A process a memhook already traces is asked
instead: SIGUSR1, a snapshot with its check, printed by that memhook. Exit code 23 (LSan's,
--fail-on-leak's) when lost bytes no suppression covers were found, 1 when no check was taken."""
from __future__ import annotations

import os
import signal

from ..common import procfs
from ..reporters import suppressions
from .arguments import UsageError
from .attach import attach_parser, tracing_setup
from .snapshot import tracing_memhook

AT_ONCE_S = 1e-6  # --duration's default: the check as soon as attached (the run's first step)


def leaks_parser():
    p = attach_parser(prog="memhook leaks", page="docs/leak-analysis.md", description=(
        "Check a running process for leaks now: the blocks no pointer reaches (valgrind's "
        "definitely, indirectly and possibly lost), by call stack for those allocated while "
        "traced, by size and type for those from before. Exit code 23 when some are lost."))
    # The text is about leaks alone (reporters/leaks.py); JSON has everything.
    p.set_defaults(no_live=True, fail_on_leak=suppressions.FailOnLeak("lost", 0),
                   leaks_only=True)
    return p


def run_leaks(argv: list[str]) -> int:
    from . import driver
    a = leaks_parser().parse_args(argv)
    if not a.reachability:
        raise UsageError("memhook leaks is the leak check: drop --no-reachability")
    if a.pid and len(a.pid) == 1:
        procfs.process_info(a.pid[0])  # (one line if there is no such process, or not ours)
        owner = tracing_memhook(a.pid[0])
        if owner:
            os.kill(owner, signal.SIGUSR1)
            print(f"memhook: PID {a.pid[0]} is traced by memhook (PID {owner}): asked it for a "
                  "snapshot with a leak check; it prints it and writes it into its capture")
            return 0
    a.duration = a.duration or AT_ONCE_S
    opts, pushers = tracing_setup(a)
    stop = {"reason": ""}

    def on_signal(signum, _frame):
        stop["reason"] = "interrupted" if signum == signal.SIGINT else "terminated"

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return driver.run(a, opts, stop, pushers)
