"""Command line: `memhook -p PID ...` attaches (commands/attach.py); `memhook run -- CMD` starts
a program traced from its first allocation (commands/launch.py); `memhook report FILE`
reports on a capture (commands/report.py); `memhook snapshot PID` asks a running memhook for a
snapshot (commands/snapshot.py); `memhook leaks -p PID` checks a process for lost blocks now
(commands/leaks.py); `memhook trim -p PID` calls malloc_trim(0) in a
process (commands/trim.py). Every failure is one line and an exit code.

Only the standard library's os, signal and sys are imported before main() holds a handler for
Ctrl-C: everything else (numpy takes a tenth of a second) is imported under it, so an early
Ctrl-C ends in `memhook: interrupted`, never in a traceback."""
from __future__ import annotations

import gc
import os
import signal
import sys

EXIT_FAILED = 1


def main(argv: list[str] | None = None) -> int:
    whole_process = argv is None  # (the command line's own main, not a caller's)
    argv = sys.argv[1:] if argv is None else argv
    if whole_process:
        collect_less_often()
    try:
        code = run(argv)
    except KeyboardInterrupt:
        # Ctrl-C before attach began (memhook's own handler is not installed yet): nothing was
        # done; die of the signal, as interrupted programs do, so the caller sees it.
        print("memhook: interrupted", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return EXIT_FAILED
    if whole_process and argv[:1] == ["report"]:
        end_report(code)
    return code


def collect_less_often() -> None:
    """CPython's cycle collector, run every 700 allocations: a report makes hundreds of
    thousands of objects that live until it ends (frame dicts, sites, stacks) and almost no
    cycles, and each full collection walked all of them again (3 of them, 0.145 s of a
    10,000-stack HTML report's 1.1 s). Collected every 50,000, as mypy does for its own build;
    the garbage of a cycle waits at most that long."""
    gc.set_threshold(50_000, 20, 20)


def end_report(code: int) -> None:
    """Ends the process of a finished report now. Python's teardown of numpy's and the
    report's objects takes 15-20 ms, a sixth of a report's 0.13 s (heaptrack_print's whole
    time for the same program, the bar); a report leaves nothing to tear down: its files are
    closed, its plots child collected, and it starts no thread."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # (a reader gone, as when piped to head)
            pass
    os._exit(code)


def run(argv: list[str]) -> int:
    from .capture import CaptureError  # with numpy: under main()'s Ctrl-C handler
    from .commands.arguments import EXIT_USAGE, UsageError
    from .common.procfs import TargetError
    try:
        if argv and argv[0] == "report":
            from .commands.report import run_report
            return run_report(argv[1:])
        if argv and argv[0] == "run":
            from .commands.launch import run_program
            return run_program(argv[1:])
        if argv and argv[0] == "snapshot":
            from .commands.snapshot import run_snapshot
            return run_snapshot(argv[1:])
        if argv and argv[0] == "leaks":
            from .commands.leaks import run_leaks
            return run_leaks(argv[1:])
        if argv and argv[0] == "trim":
            from .commands.trim import run_trim
            return run_trim(argv[1:])
        from .commands.attach import run_attach
        return run_attach(argv)
    except UsageError as e:
        print(f"memhook: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (TargetError, CaptureError) as e:
        print(f"memhook: {e}", file=sys.stderr)
        return EXIT_FAILED
    except ImportError as e:
        if (e.name or "").startswith("opentelemetry"):  # pyproject.toml: not for Python 3.9
            print("memhook: OTLP profiles need opentelemetry-proto 1.45, which needs Python "
                  f">= 3.10 (this is {sys.version.split()[0]})", file=sys.stderr)
        else:
            print(f"memhook: its native parts are missing ({e}); reinstall memhook",
                  file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:
        print(f"memhook: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""),
              file=sys.stderr)
        return EXIT_FAILED
