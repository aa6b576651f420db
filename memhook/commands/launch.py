"""`memhook run [options] -- CMD ARGS...`: start a program traced from its first allocation
(inject/startup.py holds it before its constructors), with every option of `memhook -p`. The
program keeps its stdin, stdout, stderr, process group and exit status: memhook writes only to
stderr (or --report-file), passes on the signals sent to memhook itself, and exits with the
program's code (128+N after signal N), or 23 under --fail-on-leak when it leaked."""
from __future__ import annotations

import argparse
import contextlib
import signal
import sys

from ..capture import private_file
from .arguments import Parser, UsageError
from .attach import add_tracing_arguments, tracing_setup

# Sent to memhook, passed on to the program; a terminal's (the kernel's) reached it already.
# (SIGUSR1 is memhook's own: a snapshot, as under -p.)
FORWARDED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2}


def run_parser() -> Parser:
    p = Parser(prog="memhook run", usage="[options] -- CMD [ARGS...]", page="docs/run-mode.md", description="Start a program under memhook, traced from its "
               "first allocation (library constructors and static initializers included), and "
               "report what it still held at exit. Exits with the program's exit code.")
    add_tracing_arguments(p)
    p.add_argument("--report-file", metavar="FILE", help="write the final report to FILE "
                   "(default: standard error, so the program's standard output stays its own)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                   help="the program and its arguments")
    return p


def run_program(argv: list[str]) -> int:
    from . import driver
    a = run_parser().parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        raise UsageError("no program given: memhook run [options] -- CMD ARGS...")
    a.pid, a.pid_of, a.command = None, None, command
    opts, pushers = tracing_setup(a)
    if a.report_file:
        try:  # unwritable or unsafe: said before the program starts
            private_file.create(a.report_file).close()
        except OSError as e:
            raise UsageError(f"cannot write {a.report_file}: {e.strerror}") from None
    # Held, and read in memhook's loop (driver.py): the program unblocks them for itself.
    a.signal_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED | {signal.SIGUSR1})
    a.forwarded = FORWARDED
    stop = {"reason": ""}
    from ..inject.startup import ProgramEnded
    with contextlib.redirect_stdout(sys.stderr):
        try:
            return driver.run(a, opts, stop, pushers)
        except ProgramEnded as e:  # (its own message, the loader's say, is above this line)
            print(f"memhook: {e}", file=sys.stderr)
            return e.returncode
