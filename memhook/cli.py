"""Command line: `memhook -p PID ...` attaches (commands/attach.py); `memhook report FILE`
reports on a capture (commands/report.py). Every failure is one line and an exit code."""
from __future__ import annotations

import os
import signal
import sys

from .commands.arguments import EXIT_FAILED, EXIT_USAGE, UsageError


def main(argv: list[str] | None = None) -> int:
    from .capture import CaptureError
    from .procfs import TargetError
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "report":
            from .commands.report import run_report
            return run_report(argv[1:])
        from .commands.attach import run_attach
        return run_attach(argv)
    except UsageError as e:
        print(f"memhook: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (TargetError, CaptureError) as e:
        print(f"memhook: {e}", file=sys.stderr)
        return EXIT_FAILED
    except ImportError as e:
        print(f"memhook: its native parts are missing ({e}); install it with `pip install .`",
              file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        # Ctrl-C before attach began (memhook's own handler is not installed yet): nothing was
        # done; die of the signal, as interrupted programs do, so the caller sees it.
        print("memhook: interrupted", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return EXIT_FAILED
    except OSError as e:
        print(f"memhook: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""),
              file=sys.stderr)
        return EXIT_FAILED
