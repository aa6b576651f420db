"""`memhook -p PID`: attach, follow the session (live view, capture), detach, report; several
processes (`-p A,B`, `--pid-of NAME`) go to fleet.py."""
from __future__ import annotations

import json
import signal
import sys
import time

from .. import __version__
from ..live_view import LiveView
from ..procfs import one_line
from ..session import MAX_SIZE, Options
from .arguments import (EXIT_FAILED, EXIT_OK, Parser, UsageError, add_otlp_arguments, otlp_url,
                        pid_list, positive_float, size_arg)


def attach_parser() -> Parser:
    p = Parser(prog="memhook", description="Attach to a running process and report the call "
               "stacks that hold unfreed memory. `memhook report FILE` reads a capture.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("-p", "--pid", type=pid_list, metavar="PID[,PID...]",
                       help="process(es) to attach to")
    which.add_argument("--pid-of", metavar="NAME", help="every process whose executable (or "
                       "command name) is NAME, and those that start while memhook runs")
    p.add_argument("--duration", type=positive_float, help="detach after this many seconds")
    p.add_argument("-o", "--output", help="write a capture file on detach")
    p.add_argument("--min-size", type=size_arg, default=Options.min_size,
                   help="trace allocations of at least "
                   "this many bytes")
    p.add_argument("--max-size", type=size_arg, default=None, help="trace allocations of at most "
                   "this many bytes")
    p.add_argument("--depth", type=int, default=Options.depth,
                   help=f"backtrace frames (default {Options.depth})")
    p.add_argument("--interval", type=positive_float, default=5.0,
                   help="seconds between live views (default 5)")
    p.add_argument("--top", type=int, default=10, help="call stacks shown (default 10)")
    p.add_argument("--no-live", action="store_true", help="no periodic view, final report only")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="final report format")
    p.add_argument("--ring-size", type=size_arg, default=Options.ring_bytes,
                   help=f"bytes per thread ring (power of two, default "
                   f"{Options.ring_bytes >> 20}MiB)")
    p.add_argument("--rings", type=int, default=Options.rings,
                   help=f"rings (writer threads) (default {Options.rings})")
    p.add_argument("--unhook-after", type=positive_float, default=Options.abandon_after_s,
                   help="if memhook dies, the target unhooks itself after this many seconds "
                   f"without its heartbeat (default {Options.abandon_after_s:g})")
    p.add_argument("--sample-rate", type=size_arg, default=Options.sample_rate, metavar="BYTES",
                   help="sample allocations: on average one per BYTES allocated (a Poisson "
                   "process per byte), each weighted by 1/P so totals stay unbiased; the "
                   "unsampled cost a countdown (default 0: trace every call)")
    p.add_argument("--record-events", action="store_true",
                   help="keep every event in the capture (for lifetime analyses)")
    p.add_argument("--library-dir", metavar="DIR", default="",
                   help="directory, as the target sees its filesystem, to load the hook library "
                        "from (default: the first of /tmp, /var/tmp, /dev/shm not mounted noexec)")
    p.add_argument("--snapshot-interval", type=positive_float, default=60.0,
                   help="seconds between aggregate snapshots in the capture (default 60)")
    add_otlp_arguments(p, "every --push-interval and at detach")
    p.add_argument("--pprof-push", type=otlp_url, metavar="URL", help="send the profile as "
                   "gzip pprof to Pyroscope's ingest API (URL/ingest) every --push-interval and "
                   "at detach")
    p.add_argument("--push-interval", type=positive_float, default=60.0, metavar="S",
                   help="seconds between pushes (default 60)")
    p.add_argument("--version", action="version", version=f"memhook {__version__}")
    return p


def report_attached(session, result: dict) -> None:
    late = result.get("late", 0)
    print(f"memhook: attached to PID {session.pid} ({one_line(session.info.command)}): "
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


RESCAN_S = 2.0  # libraries loaded without the dlopen hook get their unwind rows this late


class Follower:
    """Follows one attached session: samples, records and (unless told not to) shows it every
    interval, and tells when its process ended."""

    def __init__(self, session, recorder, a, view_label: str = "", symbols: dict | None = None):
        from ..symbolize import Symbolizer
        self.session, self.recorder, self.a = session, recorder, a
        self.symbolizer = Symbolizer(session.modules.values(), cache=symbols)
        self.view = LiveView(session, a.top, sys.stdout.isatty() and not view_label, view_label)
        self.t0 = time.monotonic()
        self.next_tick = self.t0 + a.interval
        self.first_checkpoint = self.t0 + min(1.0, a.interval)  # a capture cut off early
        self.next_rescan = self.t0 + RESCAN_S                    # still holds something

    def step(self, now: float) -> str:
        """One look: '' while the process runs on, else why its session ends."""
        from .. import elf
        session, recorder = self.session, self.recorder
        alive = session.target_alive()
        rescan = now >= self.next_rescan
        if rescan:
            self.next_rescan = now + RESCAN_S
        if alive and session.poll_loads(rescan):
            self.symbolizer.set_modules(session.modules.values())
        if not alive:
            return "target exited"
        if now >= self.next_tick and session.target_execed():
            return "target exec'd another program"
        if self.first_checkpoint and now >= self.first_checkpoint:
            self.first_checkpoint = 0
            recorder.checkpoint()
        if now >= self.next_tick:
            self.next_tick = now + self.a.interval
            known = len(session.modules)
            if session.target_alive():
                session.modules = elf.modules(session.pid, session.modules)
            if len(session.modules) != known:
                self.symbolizer.set_modules(session.modules.values())
            recorder.tick()
            if not self.a.no_live:
                self.view.show(self.symbolizer)
        return ""


def follow(session, recorder, a, stop: dict) -> None:
    """Until Ctrl-C, --duration or the target's exit: sample, record and show, every interval."""
    follower = Follower(session, recorder, a)
    while not stop["reason"]:
        time.sleep(0.05)
        now = time.monotonic()
        if a.duration and now - follower.t0 >= a.duration:
            stop["reason"] = "duration reached"
        elif not stop["reason"]:  # (a signal sets it at any moment: never overwritten)
            why = follower.step(now)
            if why:
                stop["reason"] = stop["reason"] or why


def print_final_report(cap, a, symbols: dict | None = None) -> None:
    """The report at the end of a run, as --format asks (both the one-process and the fleet
    path)."""
    from .. import report
    from ..symbolize import Symbolizer
    rep = report.build(cap, Symbolizer(cap.modules, cache=symbols))
    print(json.dumps(rep, indent=1) if a.format == "json" else report.render_text(rep, a.top),
          flush=True)


def report_pushes(pusher) -> None:
    print(f"memhook: {pusher.sent} profiles sent to {pusher.endpoint}"
          + (f"; {pusher.failed} pushes failed ({pusher.last_error})" if pusher.failed else "")
          + (f"; {pusher.dropped} dropped (backlog full)" if pusher.dropped else ""), flush=True)


def attach_or_explain(session) -> dict:
    """session.attach(), but a target that died meanwhile is said to have exited, whatever
    GDB or /proc made of it (a zombie refuses ptrace: not a permissions problem)."""
    from .. import procfs
    try:
        return session.attach()
    except (procfs.TargetError, OSError):
        if session.info is not None and not procfs.alive(session.info):
            raise procfs.TargetError(f"PID {session.pid} exited while memhook was attaching: "
                                     "nothing to trace") from None
        raise


def run_attach(argv: list[str]) -> int:
    from .. import capture
    from ..session import Session
    a = attach_parser().parse_args(argv)
    if a.top < 1:
        raise UsageError("--top must be at least 1")
    opts = Options(depth=a.depth, min_size=a.min_size,
                   max_size=MAX_SIZE if a.max_size is None else a.max_size,
                   ring_bytes=a.ring_size, rings=a.rings, abandon_after_s=a.unhook_after,
                   sample_rate=a.sample_rate, library_dir=a.library_dir)
    try:
        opts.check()
    except ValueError as e:
        raise UsageError(str(e)) from None

    pushers = []
    if a.otlp or a.pprof_push:
        from .. import otlp, pprof
        labels = dict(a.label)
        sinks = ([otlp.OtlpSink(a.otlp, labels)] if a.otlp else []) + \
            ([pprof.PyroscopeSink(a.pprof_push, labels)] if a.pprof_push else [])
        pushers = [otlp.Pusher([], sink, a.push_interval) for sink in sinks]
    stop = {"reason": ""}

    def on_signal(signum, _frame):
        stop["reason"] = "interrupted" if signum == signal.SIGINT else "terminated"

    # Installed before attaching: a Ctrl-C during attach means "detach as soon as attached".
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if a.pid_of or len(a.pid) > 1:
        from .. import fleet
        return fleet.run(a, opts, stop, pushers)
    session = Session(a.pid[0], opts)
    # Opened before attaching: an unwritable -o fails while the target is untouched.
    recorder = capture.Recorder(session, a.output, snapshot_every=a.snapshot_interval,
                                record_events=a.record_events)
    result = attach_or_explain(session)
    try:
        report_attached(session, result)
        recorder.start()
        for p in pushers:
            p.add(session)
            p.start()
        follow(session, recorder, a, stop)
    finally:  # whatever happened since attach, the target gets its slots back
        stop["reason"] = stop["reason"] or "error"
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # detaching must not be cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        session.detach(stop["reason"])
    print(f"memhook: detached ({stop['reason']}): {session.restored} slots restored"
          + (f"; target paused {session.pause_ms['detach']:.1f} ms"
             if "detach" in session.pause_ms else ""), flush=True)
    for p in pushers:
        p.stop()
        report_pushes(p)
    cap = recorder.finish()
    if a.output:
        print(f"memhook: capture written to {a.output} ({recorder.writer.bytes} bytes)",
              flush=True)
    print_final_report(cap, a)
    if session.detach_error:
        print(f"memhook: could not restore the slots ({session.detach_error}); the target "
              "keeps running with memhook's hooks in place", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
