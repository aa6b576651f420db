"""Command line: `memhook -p PID ...` attaches; `memhook report FILE` reports on a capture."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time

from . import __version__

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


class UsageError(Exception):
    pass


def size_arg(text: str) -> int:
    m = SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (examples: 1024, 64K, 2MiB)")
    return int(m.group(1)) * 1024 ** "bkmgt".index((m.group(2) or "b").lower())


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


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(message)


def attach_parser() -> Parser:
    p = Parser(prog="memhook", description="Attach to a running process and report the call "
               "stacks that hold unfreed memory. `memhook report FILE` reads a capture.")
    p.add_argument("-p", "--pid", type=pid_arg, required=True, help="process to attach to")
    p.add_argument("--duration", type=positive_float, help="detach after this many seconds")
    p.add_argument("-o", "--output", help="write a capture file on detach")
    p.add_argument("--min-size", type=size_arg, default=0, help="trace allocations of at least "
                   "this many bytes")
    p.add_argument("--max-size", type=size_arg, default=None, help="trace allocations of at most "
                   "this many bytes")
    p.add_argument("--depth", type=int, default=32, help="backtrace frames (default 32)")
    p.add_argument("--interval", type=positive_float, default=5.0,
                   help="seconds between live views (default 5)")
    p.add_argument("--top", type=int, default=10, help="call stacks shown (default 10)")
    p.add_argument("--no-live", action="store_true", help="no periodic view, final report only")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="final report format")
    p.add_argument("--ring-size", type=size_arg, default=4 << 20,
                   help="bytes per thread ring (power of two, default 4MiB)")
    p.add_argument("--rings", type=int, default=64, help="rings (writer threads) (default 64)")
    p.add_argument("--unhook-after", type=positive_float, default=5.0,
                   help="if memhook dies, the target unhooks itself after this many seconds "
                   "without its heartbeat (default 5)")
    p.add_argument("--sample-rate", type=size_arg, default=0, metavar="BYTES",
                   help="sample allocations: on average one per BYTES allocated (a Poisson "
                   "process per byte), each weighted by 1/P so totals stay unbiased; the "
                   "unsampled cost a countdown (default 0: trace every call)")
    p.add_argument("--record-events", action="store_true",
                   help="keep every event in the capture (for lifetime analyses)")
    p.add_argument("--snapshot-interval", type=positive_float, default=60.0,
                   help="seconds between aggregate snapshots in the capture (default 60)")
    p.add_argument("--version", action="version", version=f"memhook {__version__}")
    return p


def report_parser() -> Parser:
    p = Parser(prog="memhook report", description="Report on a capture file, on this host or "
               "another one.")
    p.add_argument("capture", help="capture file written by memhook -o")
    p.add_argument("--format", choices=("text", "json", "pprof", "collapsed", "html"),
                   default="text", help="text (default), json, pprof (gzip profile.proto), "
                   "collapsed (folded stacks for flame graphs), html (one self-contained file)")
    p.add_argument("--plots", metavar="DIR", help="also write the report's pictures here")
    p.add_argument("--plot-format", choices=("png", "svg"), default="png")
    p.add_argument("-o", "--output", help="write the report here instead of standard output")
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
    p.add_argument("--diff", metavar="OTHER", help="per-stack change in outstanding bytes from "
                   "this capture to OTHER")
    p.add_argument("--min-age", type=positive_float, default=60.0,
                   help="leak suspects: live blocks at least this many seconds old count as old")
    p.add_argument("--transient-threshold", type=positive_float, default=1.0,
                   help="transient allocations: freed within this many milliseconds (default 1)")
    p.add_argument("--debug-dir", action="append", default=[],
                   help="directory of debug files by build-id (.build-id/ab/cdef.debug); "
                   "repeatable; /usr/lib/debug is always searched")
    p.add_argument("--sysroot", help="look for modules under this directory first")
    p.add_argument("--symbolizer", choices=("auto", "pyelftools", "llvm-symbolizer", "addr2line",
                                            "eu-addr2line"), default="auto",
                   help="file:line and inlined frames: a system symbolizer when installed "
                   "(auto), or pyelftools (always available, slower on large binaries)")
    return p


def emit(text, path: str | None) -> None:
    data = text if isinstance(text, bytes) else (text + "\n").encode()
    if path:
        with open(path, "wb") as f:
            f.write(data)
    elif isinstance(text, bytes) and sys.stdout.isatty():
        raise UsageError("pprof output is binary: write it with -o FILE")
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


def run_report(argv: list[str]) -> int:
    from . import capture, pprof, report
    from .symbolize import Lookup, Symbolizer
    a = report_parser().parse_args(argv)
    if a.top is not None and a.top < 1:
        raise UsageError("--top must be at least 1")
    try:
        lookup = Lookup(a.debug_dir, a.sysroot)
        filters = report.Filters(a.min_size, a.max_size, a.module, a.function, a.top,
                                 a.min_age, transient_ns=a.transient_threshold * 1e6)
    except ValueError as e:
        raise UsageError(str(e)) from None
    cap = capture.read(a.capture)
    try:
        symbolizer = Symbolizer(cap.modules, lookup, a.symbolizer)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not cap.complete:
        print(f"memhook: warning: {a.capture} was cut off; reporting what it holds",
              file=sys.stderr)
    if a.diff:
        if a.format not in ("text", "json"):
            raise UsageError("--diff reports as text or json")
        other = capture.read(a.diff)
        other_symbolizer = Symbolizer(other.modules, lookup, a.symbolizer)
        everything = report.Filters(a.min_size, a.max_size, a.module, a.function)
        d = report.diff(report.build(cap, symbolizer, everything),
                        report.build(other, other_symbolizer, everything), cap, other)
        if a.top:
            d["sites"] = d["sites"][:a.top]
        emit(json.dumps(d, indent=1) if a.format == "json"
             else report.render_diff_text(d, top=a.top or 10), a.output)
        return EXIT_OK
    rep = report.build(cap, symbolizer, filters)
    if a.plots:
        from . import plots
        for path in plots.write(cap, rep, symbolizer, a.plots, a.plot_format):
            print(f"memhook: wrote {path}", file=sys.stderr)
    if a.format == "html":
        from . import html
        out = html.render(cap, rep, symbolizer)
    elif a.format == "json":
        out = json.dumps(rep, indent=1)
    elif a.format == "pprof":
        out = pprof.profile(cap, rep, symbolizer)
    elif a.format == "collapsed":
        out = report.render_collapsed(rep, a.weight)
    else:
        out = report.render_text(rep, top=a.top or 10)
    emit(out, a.output)
    return EXIT_OK


class LiveView:
    """What memhook shows while attached: on a terminal a table redrawn in place (top-like),
    otherwise plain lines, every --interval."""

    HISTORY = 20  # samples kept per stack for its growth rate

    def __init__(self, session, top: int, tty: bool):
        self.session, self.top, self.tty = session, top, tty
        self.t0 = time.monotonic()
        self.history: dict = {}  # stack -> [(t, bytes)]
        self.last = (self.t0, 0, 0)  # time, allocs, frees

    def lines(self, symbolizer) -> list[str]:
        import numpy as np
        from . import analysis, procfs
        from .report import human_bytes
        consumer = self.session.consumer
        now = time.monotonic()
        t = consumer.totals()
        out = consumer.sites()["outstanding_bytes"]
        offsets, frames = consumer.stacks()
        dt = max(now - self.last[0], 1e-6)
        alloc_rate = (t["alloc_count"] - self.last[1]) / dt
        free_rate = (t["free_count"] - self.last[2]) / dt
        self.last = (now, t["alloc_count"], t["free_count"])
        mem = procfs.memory(self.session.pid)
        stamp = time.strftime("%H:%M:%S")
        head = (f"outstanding {human_bytes(t['outstanding_bytes'])} in {t['outstanding_count']} "
                f"blocks; {alloc_rate:.0f} allocs/s, {free_rate:.0f} frees/s; "
                f"{t['dropped_events']} dropped; RSS {human_bytes(mem['rss_bytes'])} "
                f"(anon {human_bytes(mem['anon_bytes'])})")
        rows = []
        for i in np.argsort(-out.astype(np.float64))[:self.top]:
            if out[i] == 0:
                break
            hist = self.history.setdefault(int(i), [])
            hist.append((now - self.t0, float(out[i])))
            del hist[:-self.HISTORY]
            growth = analysis.theil_sen(np.array([h[0] for h in hist]),
                                        np.array([h[1] for h in hist])) * 60
            fr = frames[offsets[i]:offsets[i + 1]]
            where = " <- ".join((symbolizer.frame(int(x)).function or hex(int(x))) for x in fr[:3])
            rows.append((human_bytes(int(out[i])), f"{'+' if growth >= 0 else '-'}"
                         f"{human_bytes(abs(growth))}/min", where))
        if not self.tty:
            return [f"[{stamp}] {head}"] + [f"  {b:>10}  {g:>14}  {w}" for b, g, w in rows]
        elapsed = int(now - self.t0)
        return ([f"memhook  PID {self.session.pid}  attached "
                 f"{elapsed // 3600:02d}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}  "
                 f"[{stamp}]  Ctrl-C detaches  {self.session.info.command}", head, "",
                 f"{'OUTSTANDING':>12}  {'GROWTH':>14}  WHERE"]
                + [f"{b:>12}  {g:>14}  {w}" for b, g, w in rows])

    def show(self, symbolizer) -> None:
        text = "\n".join(self.lines(symbolizer))
        if self.tty:
            width = shutil.get_terminal_size().columns
            text = "\x1b[H\x1b[2J" + "\n".join(line[:width] for line in text.splitlines())
        print(text, flush=True)


def report_attached(session, result: dict) -> None:
    late = result.get("late", 0)
    print(f"memhook: attached to PID {session.pid} ({session.info.command}): "
          f"{len(session.patched)} slots patched"
          + (f", {late} in libraries loaded meanwhile" if late else "")
          + (f", {len(session.skipped)} left alone" if session.skipped else "")
          + f"; target paused {session.pause_ms['attach']:.1f} ms", flush=True)
    for path, why in session.skipped_objects:
        if why != "the dynamic loader":
            print(f"memhook: not hooking {path}: {why}", file=sys.stderr)
    for slot, value in session.skipped:
        held = "is unreadable" if value is None else f"holds 0x{value:x}"
        print(f"memhook: left alone: the {slot.symbol} slot at 0x{slot.addr:x} in {slot.module} "
              f"{held}, not {slot.symbol} itself", file=sys.stderr)


def follow(session, recorder, a, stop: dict) -> None:
    """Until Ctrl-C, --duration or the target's exit: sample, record and show, every interval."""
    from . import elf
    from .symbolize import Symbolizer
    symbolizer = Symbolizer(session.modules.values())
    view = LiveView(session, a.top, sys.stdout.isatty())
    t0 = time.monotonic()
    next_tick = t0 + a.interval
    while not stop["reason"]:
        time.sleep(0.05)
        now = time.monotonic()
        if not session.target_alive():
            stop["reason"] = "target exited"
        elif now >= next_tick and session.target_execed():
            stop["reason"] = "target exec'd another program"
        elif a.duration and now - t0 >= a.duration:
            stop["reason"] = "duration reached"
        if now >= next_tick and not stop["reason"]:
            next_tick = now + a.interval
            known = len(session.modules)
            if session.target_alive():
                session.modules = elf.modules(session.pid, session.modules)
            if len(session.modules) != known:
                symbolizer.set_modules(session.modules.values())
            recorder.tick()
            if not a.no_live:
                view.show(symbolizer)


def run_attach(argv: list[str]) -> int:
    from . import capture, report
    from .session import MAX_SIZE, Options, Session
    from .symbolize import Symbolizer
    a = attach_parser().parse_args(argv)
    if a.top < 1:
        raise UsageError("--top must be at least 1")
    opts = Options(depth=a.depth, min_size=a.min_size,
                   max_size=MAX_SIZE if a.max_size is None else a.max_size,
                   ring_bytes=a.ring_size, rings=a.rings, abandon_after_s=a.unhook_after,
                   sample_rate=a.sample_rate)
    try:
        opts.check()
    except ValueError as e:
        raise UsageError(str(e)) from None

    stop = {"reason": ""}

    def on_signal(signum, _frame):
        stop["reason"] = "interrupted" if signum == signal.SIGINT else "terminated"

    # Installed before attaching: a Ctrl-C during attach means "detach as soon as attached".
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    session = Session(a.pid, opts)
    # Opened before attaching: an unwritable -o fails while the target is untouched.
    recorder = capture.Recorder(session, a.output, snapshot_every=a.snapshot_interval,
                                record_events=a.record_events)
    result = session.attach()
    try:
        report_attached(session, result)
        recorder.start()
        follow(session, recorder, a, stop)
    finally:  # whatever happened since attach, the target gets its slots back
        stop["reason"] = stop["reason"] or "error"
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # detaching must not be cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        session.detach(stop["reason"])
    print(f"memhook: detached ({stop['reason']}): {session.restored} slots restored"
          + (f"; target paused {session.pause_ms['detach']:.1f} ms"
             if "detach" in session.pause_ms else ""), flush=True)
    cap = recorder.finish()
    if a.output:
        print(f"memhook: capture written to {a.output} ({recorder.writer.bytes} bytes)",
              flush=True)
    rep = report.build(cap, Symbolizer(cap.modules))
    if a.format == "json":
        print(json.dumps(rep, indent=1), flush=True)
    else:
        print(report.render_text(rep, a.top), flush=True)
    if session.detach_error:
        print(f"memhook: could not restore the slots ({session.detach_error}); the target "
              "keeps running with memhook's hooks in place", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    from .capture import CaptureError
    from .procfs import TargetError
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "report":
            return run_report(argv[1:])
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
