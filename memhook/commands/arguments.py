"""What both commands' arguments share: value types, one-line usage errors, exit codes."""
from __future__ import annotations

import argparse
import shutil

from ..common.format import parse_size
from ..reporters import suppressions

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def size_arg(text: str) -> int:
    size = parse_size(text)
    if size is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (examples: 1024, 64K, 2MiB)")
    return size


DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def duration_arg(text: str) -> float:
    """Seconds (at least 0), from 10ms, 500us, 0.2s or 0.2 (seconds)."""
    number, unit = text.strip(), "s"
    for u in sorted(DURATION_UNITS, key=len, reverse=True):
        if number.endswith(u):
            number, unit = number[:-len(u)], u
            break
    try:
        v = float(number) * DURATION_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (examples: 10ms, 0.5s)") \
            from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return v


def pid_arg(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"invalid PID {text!r}: a positive number is expected")
    return int(text)


def pid_list(text: str) -> list[int]:
    pids = [pid_arg(part.strip()) for part in text.split(",")]
    if len(set(pids)) != len(pids):
        raise argparse.ArgumentTypeError(f"a PID is given twice in {text!r}")
    return pids


def otlp_url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"an http:// or https:// URL is expected, not {text!r}")
    return text


def label_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"KEY=VALUE is expected, not {text!r}")
    return key, value


def add_otlp_arguments(p: argparse.ArgumentParser, when: str) -> None:
    """--otlp URL and --label KEY=VALUE (repeated; read them with dict(a.label))."""
    p.add_argument("--otlp", type=otlp_url, metavar="URL", help="send the profile to this "
                   f"OpenTelemetry Collector (OTLP/HTTP, e.g. http://collector:4318) {when}")
    p.add_argument("--label", type=label_arg, action="append", default=[], metavar="KEY=VALUE",
                   help="a resource attribute of the OTLP profile (service=NAME: service.name)")


def fail_arg(text: str):
    """--fail-on-leak's value: BYTES of lost blocks, or any-outstanding (every byte held)."""
    if text.strip() == "any-outstanding":
        return suppressions.FailOnLeak("outstanding", 0)
    return suppressions.FailOnLeak("lost", size_arg(text))


def pause_arg(text: str) -> float:
    """Milliseconds: a bare number is milliseconds, or a duration (200ms, 0.2s)."""
    try:
        return float(text) if float(text) >= 0 else duration_arg(text) * 1e3
    except ValueError:
        return duration_arg(text) * 1e3


def add_leak_check_arguments(p: argparse.ArgumentParser) -> None:
    """--suppressions FILE (repeatable) and --fail-on-leak[=BYTES] (suppressions.py)."""
    p.add_argument("--suppressions", action="append", default=[], metavar="FILE",
                   help="known leaks, in LeakSanitizer's format (leak:PATTERN; heaptrack's and "
                   "LSan's files as they are); repeatable")
    p.add_argument("--fail-on-leak", nargs="?", type=fail_arg,
                   const=suppressions.FailOnLeak("lost", 0), default=None, metavar="BYTES",
                   help="exit with code 23 (LeakSanitizer's) when more than BYTES (default 0) "
                   "are lost (definitely or indirectly: no pointer reaches them, the leak "
                   "check's words) and not suppressed; =any-outstanding: any byte still "
                   "allocated, reachable or not")
    p.add_argument("--no-suppressions", action="store_true",
                   help="apply no suppression at all (by default the program's own "
                   "__lsan_default_suppressions(), memhook's defaults and --suppressions files "
                   "apply wherever leaks are listed)")
    p.add_argument("--no-default-suppressions", dest="default_suppressions",
                   action="store_false", help="count what the runtime keeps for the life of "
                   "the process by design (stdio buffers, libstdc++'s emergency exception pool, "
                   "the loader's own) as leaks too")


def add_attribution_arguments(p: argparse.ArgumentParser) -> None:
    """--runtime-module / --runtime-function: more of what is not the leak's own frame
    (attribution.py), read with runtime_rules(a); --full-names (short_names.py)."""
    p.add_argument("--runtime-module", action="append", default=[], metavar="GLOB",
                   help="a module (file name glob) whose frames are runtime, not the leak's own "
                   "frame, beside libc, libstdc++, the loader and the allocators; repeatable")
    p.add_argument("--runtime-function", action="append", default=[], metavar="GLOB",
                   help="likewise a function (demangled name glob, e.g. 'mylib::pool::*'); "
                   "repeatable")
    p.add_argument("--full-names", action="store_true", help="full C++ names everywhere, "
                   "parameters and default template arguments included (one-line views "
                   "shorten them: std::string, no parameters)")


def runtime_rules(a):
    from ..common.attribution import Rules
    return Rules.with_user(a.runtime_module, a.runtime_function)


class OneLineHelp(argparse.HelpFormatter):
    """--help on one screen: each option on one line, its help cut to the terminal's width
    (every option in full: docs/usage.md), a short usage line."""

    def __init__(self, prog):
        width = min(shutil.get_terminal_size((100, 24)).columns, 120)
        super().__init__(prog, max_help_position=30, width=width)

    def _format_usage(self, usage, actions, groups, prefix):
        return f"usage: {self._prog} {usage or '[options]'}\n\n"

    def _split_lines(self, text, width):
        text = " ".join(text.split())
        return [text if len(text) <= width else text[:width - 1].rstrip() + "…"]


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, page: str = "docs/usage.md", **kw):
        kw.setdefault("formatter_class", OneLineHelp)
        kw.setdefault("epilog", f"Every option in full, with examples: {page} (the "
                                "documentation: mkdocs.yml in memhook's source).")
        super().__init__(*args, **kw)

    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(message)
