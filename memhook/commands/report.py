"""`memhook report FILE`: a capture as text, JSON, pprof, folded stacks or HTML, or a diff."""
from __future__ import annotations

import dataclasses
import json
import os
import sys

from ..capture import private_file
from ..common.procfs import TargetError
from .arguments import (EXIT_OK, Parser, UsageError, add_attribution_arguments,
                        add_leak_check_arguments, runtime_rules,
                        add_otlp_arguments, pid_arg, positive_float, size_arg)


def report_parser() -> Parser:
    p = Parser(prog="memhook report", usage="FILE [options]", page="docs/report-formats.md", description="Report on a capture file, on this host or "
               "another one.")
    p.add_argument("capture", help="capture file written by memhook -o")
    p.add_argument("--format", choices=("text", "json", "pprof", "collapsed", "html", "otlp",
                                        "leaks"),
                   default="text", help="text (default), json, pprof (gzip profile.proto), "
                   "collapsed (folded stacks for flame graphs), html (one self-contained file), "
                   "leaks (the leak check alone, as memhook leaks prints it)")
    p.add_argument("--plots", metavar="DIR", help="also write the report's pictures here")
    p.add_argument("--plot-format", choices=("png", "svg"), default="png")
    p.add_argument("-o", "--output", help="write the report here instead of standard output")
    add_otlp_arguments(p, "(the capture's)")
    p.add_argument("--pid", type=pid_arg, help="of a capture of several processes: report on "
                   "this one alone (default: each process, and the merged view)")
    p.add_argument("--top", type=int, default=None, help="only the N largest call stacks")
    p.add_argument("--min-size", type=size_arg, default=0,
                   help="only stacks whose average allocation is at least this size")
    p.add_argument("--max-size", type=size_arg, default=None,
                   help="only stacks whose average allocation is at most this size")
    p.add_argument("--module", help="only stacks with a frame in a module whose path contains "
                   "this")
    p.add_argument("--function", help="only stacks with a frame whose function matches this "
                   "regular expression")
    p.add_argument("--weight", choices=("outstanding", "allocated", "count"),
                   default="outstanding", help="collapsed format: what a stack weighs")
    p.add_argument("--snapshot", type=int, metavar="N", help="report on snapshot N of the "
                   "capture (SIGUSR1, `memhook snapshot`, --snapshot-when) instead of its end")
    p.add_argument("--diff", metavar="OTHER", help="per-stack change in outstanding bytes from "
                   "this capture to OTHER, another capture; or, given a number M, from snapshot "
                   "M of this capture to its end (or to --snapshot N)")
    p.add_argument("--min-age", type=positive_float, default=60.0,
                   help="leak suspects: live blocks at least this many seconds old count as old")
    p.add_argument("--transient-threshold", type=positive_float, default=1.0,
                   help="transient allocations: freed within this many milliseconds (default 1)")
    add_leak_check_arguments(p)
    add_attribution_arguments(p)
    p.add_argument("--print-suppressions", action="store_true",
                   help="write one suppression per leaking stack (LeakSanitizer's format), to "
                   "edit and pass back with --suppressions")
    p.add_argument("--debug-dir", action="append", default=[],
                   help="directory of debug files by build-id (.build-id/ab/cdef.debug); "
                   "repeatable; /usr/lib/debug is always searched")
    p.add_argument("--sysroot", help="look for modules under this directory first")
    p.add_argument("--symbolizer", choices=("auto", "libdw", "pyelftools", "llvm-symbolizer",
                                            "addr2line", "eu-addr2line"), default="auto",
                   help="file:line and inlined frames: elfutils in memhook's own process (auto, "
                   "libdw), pyelftools, or a system symbolizer run per module")
    return p


def emit(text, path: str | None) -> None:
    data = text if isinstance(text, bytes) else (text + "\n").encode()
    if path:
        with private_file.create(path) as f:
            private_file.write_all(f, data)
    elif isinstance(text, bytes) and sys.stdout.isatty():
        raise UsageError("pprof and otlp output is binary: write it with -o FILE")
    else:
        private_file.write_all(sys.stdout.buffer, data)
        sys.stdout.flush()


def snapshot_of(cap, number: int, path: str):
    """Snapshot `number` of a capture (capture/snapshots.py), or a one-line usage error."""
    from ..capture import snapshots
    try:
        return snapshots.at(cap, number)
    except KeyError:
        have = ", ".join(map(str, snapshots.numbers(cap))) or "none"
        raise UsageError(f"{path} holds no snapshot {number} (snapshots: {have})") from None


def lists_outstanding(a) -> bool:
    """Whether the report lists only stacks still holding bytes (model.Filters): as text, or
    the suppressions it would print; the other formats hold every stack (the flame graphs, a
    profile's allocated bytes)."""
    return (a.format == "text" and not a.diff and not a.plots and not a.otlp) or \
        bool(a.print_suppressions)


def run_report(argv: list[str]) -> int:
    from .. import capture, reporters
    from ..reporters import model, suppressions
    from ..reporters.text import render_diff_text
    from ..symbolize import Lookup, Symbolizer
    a = report_parser().parse_args(argv)
    if a.top is not None and a.top < 1:
        raise UsageError("--top must be at least 1")
    try:
        lookup = Lookup(a.debug_dir, a.sysroot)
        filters = model.Filters(a.min_size, a.max_size, a.module, a.function, a.top,
                                a.min_age, transient_ns=a.transient_threshold * 1e6,
                                runtime=runtime_rules(a), outstanding_only=lists_outstanding(a))
        suppressions.check_arguments(a)  # (a bad file is one line, before the capture is read)
    except ValueError as e:
        raise UsageError(str(e)) from None
    cap = capture.read(a.capture)
    if a.pid is not None:
        chosen = [c for c in (cap.processes or [cap]) if c.meta.get("pid") == a.pid]
        if not chosen:
            pids = ", ".join(str(c.meta.get("pid")) for c in cap.processes or [cap])
            raise UsageError(f"{a.capture} holds no process {a.pid} (it holds {pids})")
        cap = chosen[0]
    try:
        symbolizer = Symbolizer(cap.modules, lookup, a.symbolizer)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not cap.complete:
        print(f"memhook: warning: {a.capture} was cut off; reporting what it holds",
              file=sys.stderr)
    whole = cap
    if a.snapshot is not None:
        cap = snapshot_of(whole, a.snapshot, a.capture)
    if a.diff:
        if a.format not in ("text", "json"):
            raise UsageError("--diff reports as text or json")
        if a.diff.isdigit() and not os.path.exists(a.diff):  # a snapshot of this capture
            base, other = snapshot_of(whole, int(a.diff), a.capture), cap
            other_symbolizer = symbolizer
        else:
            base, other = cap, capture.read(a.diff)
            other_symbolizer = symbolizer.for_modules(other.modules)
        everything = model.Filters(a.min_size, a.max_size, a.module, a.function)
        d = model.diff(model.build(base, symbolizer, everything),
                       model.build(other, other_symbolizer, everything), base, other)
        model.attribute(d, filters.runtime)
        if base is not cap or a.snapshot is not None:
            d["base"]["snapshot"] = int(a.diff) if base is not cap else a.snapshot
            d["other"]["snapshot"] = a.snapshot if base is not cap else None
        if a.top:
            d["sites"] = d["sites"][:a.top]
        emit(json.dumps(d, separators=(",", ":")) if a.format == "json"
             else render_diff_text(d, top=a.top or 10, full_names=a.full_names), a.output)
        return EXIT_OK
    figures = None
    if a.format == "html" and not a.otlp and not a.print_suppressions:
        from ..reporters.plots_beside import Beside
        figures = Beside(cap, symbolizer, "svg")  # drawn meanwhile, in a child
    rep = model.build(cap, symbolizer, filters)
    known = suppressions.apply_to_report(rep, cap, a)
    if known is not None and a.top:  # (the check weighs every leaking stack, not the --top)
        whole = model.build(cap, symbolizer, dataclasses.replace(filters, top=None))
        rep["unsuppressed"] = suppressions.apply(whole, known)["unsuppressed"]
    if a.print_suppressions:
        emit(suppressions.suggested(rep), a.output)
        return EXIT_OK
    if a.otlp:
        from .. import push
        from ..reporters.otlp import capture_request
        req = capture_request(cap, rep, symbolizer, dict(a.label), filters)
        if a.format == "otlp":
            emit(req.SerializeToString(), a.output)
        try:
            rejected = push.push(a.otlp, req)
        except push.PushError as e:
            raise TargetError(str(e)) from None
        print(f"memhook: profile sent to {push.endpoint(a.otlp)}" + (
            f"; the collector rejected {rejected} profiles" if rejected else ""), file=sys.stderr)
        return EXIT_OK
    if a.format == "otlp":
        emit(reporters.render("otlp", cap, rep, symbolizer, labels=dict(a.label),
                              filters=filters), a.output)
        return EXIT_OK
    if a.plots:
        from ..reporters import plots
        for path in plots.write(cap, rep, symbolizer, a.plots, a.plot_format):
            print(f"memhook: wrote {path}", file=sys.stderr)
    emit(reporters.render(a.format, cap, rep, symbolizer, top=a.top, weight=a.weight,
                          full_names=a.full_names, figures=figures), a.output)
    if a.fail_on_leak is not None and suppressions.leaked(rep, a.fail_on_leak):
        return suppressions.EXIT_LEAKS
    return EXIT_OK
