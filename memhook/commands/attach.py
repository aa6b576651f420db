"""`memhook -p PID[,PID...]` and `memhook --pid-of NAME`: the options (shared with `memhook run`),
the pushes and the signals; memhook/commands/driver.py drives the run."""
from __future__ import annotations

import argparse
import signal

from .. import __version__
from ..consumer import snapshot_when
from ..consumer.session import MAX_SIZE, Options
from ..reporters import suppressions
from .arguments import (Parser, UsageError, add_attribution_arguments, add_leak_check_arguments,
                        add_otlp_arguments, duration_arg, otlp_url, pause_arg, pid_list,
                        positive_float, runtime_rules, size_arg)

# --lossless's bound per event, a safety net (a memhook that stopped or died is noticed sooner,
# by its heartbeat): beside a CPU hog per core at nice -5, a consumer at nice 19 runs for a
# slice every few hundred ms; single waits reached 0.92 s, and 10 ms lost 810 of 2 M events
# (benchmarks/lossless.py).
LOSSLESS_MAX_WAIT_S = 10.0


def attach_parser(prog: str = "memhook", description: str = "Attach to a running process and "
                  "report the call stacks that hold unfreed memory. `memhook report FILE` reads "
                  "a capture; `memhook run -- CMD` starts a program under memhook; `memhook "
                  "leaks -p PID` checks for lost blocks now.", page: str = "docs/usage.md") -> Parser:
    p = Parser(prog=prog, usage="-p PID[,PID...] | --pid-of NAME [options]", page=page,
               description=description)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("-p", "--pid", type=pid_list, metavar="PID[,PID...]",
                       help="process(es) to attach to")
    which.add_argument("--pid-of", metavar="NAME", help="every process whose executable (or "
                       "command name) is NAME, and those that start while memhook runs")
    add_tracing_arguments(p)
    return p


def add_tracing_arguments(p: Parser) -> None:
    """What `memhook -p` and `memhook run` share: how long, what is traced, the views, the
    capture, the leak check and the pushes."""
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
    p.add_argument("--lossless", action="store_true",
                   help="drop no event: a thread whose ring is full waits for memhook to make "
                   "room, at most --max-wait per event (counted and reported); without it, "
                   "a wait that runs out makes the ring drop until memhook has emptied half")
    p.add_argument("--max-wait", type=duration_arg, default=None, metavar="DURATION",
                   help=f"the longest one event waits for room in a full ring, then is dropped "
                   f"(default {Options.max_wait_s * 1e3:g}ms, with --lossless "
                   f"{LOSSLESS_MAX_WAIT_S:g}s; 0: drop at once); without --lossless, ten "
                   "times as long when no wait outlasted it in the last 10 s")
    p.add_argument("--unhook-after", type=positive_float, default=Options.abandon_after_s,
                   metavar="S",
                   help="if memhook dies, the target unhooks itself after this many seconds "
                   f"without its heartbeat (default {Options.abandon_after_s:g})")
    p.add_argument("--sample-rate", type=size_arg, default=Options.sample_rate, metavar="BYTES",
                   help="sample allocations: on average one per BYTES allocated (a Poisson "
                   "process per byte), each weighted by 1/P so totals stay unbiased; the "
                   "unsampled cost a countdown (default 0: trace every call)")
    # (in docs/usage.md and docs/python.md only: the help keeps to one screen)
    p.add_argument("--no-python-frames", dest="python_frames", action="store_false",
                   help=argparse.SUPPRESS)
    p.add_argument("--no-pymalloc", dest="pymalloc", action="store_false",
                   help=argparse.SUPPRESS)
    p.add_argument("--record-events", action="store_true",
                   help="keep every event in the capture (for lifetime analyses)")
    p.add_argument("--library-dir", metavar="DIR", default="",
                   help="directory, as the target sees its filesystem, to load the hook library "
                        "from (default: the first of /tmp, /var/tmp, /dev/shm not mounted noexec)")
    p.add_argument("--follow-fork", action="store_true",
                   help="trace the children the process forks as processes of the same run, "
                   "each from its first allocation after fork (each child waits for memhook's "
                   "attach, about half a second)")
    add_leak_check_arguments(p)
    p.add_argument("--max-pause", type=pause_arg, default=Options.max_pause_ms, metavar="MS",
                   help="the longest the leak check at detach may stop the target, in "
                   f"milliseconds (200ms, 0.2s; default {Options.max_pause_ms:g}); beyond it "
                   "the check is skipped and the report says so")
    p.add_argument("--check-by", choices=("fork", "stop"), default=Options.check_by,
                   help="how the leak check reads the target: fork (the default: a "
                   "copy-on-write copy it makes of itself, read while it runs on; the pause "
                   "is the copy's), stop (every thread stopped for the whole scan)")
    p.add_argument("--no-reachability", dest="reachability", action="store_false",
                   help="no leak check at detach (which blocks no pointer reaches): suspects "
                   "by growth only")
    add_attribution_arguments(p)
    p.add_argument("--no-heap-census", dest="heap_census", action="store_false",
                   help="do not walk glibc malloc's heap at attach and detach (the census of "
                        "blocks allocated before attach, free space and fragmentation)")
    p.add_argument("--snapshot-interval", type=positive_float, default=60.0, metavar="S",
                   help="seconds between aggregate snapshots in the capture (default 60)")
    p.add_argument("--snapshot-when", action="append", default=[], metavar="COND",
                   help="take a snapshot (as SIGUSR1 to memhook does) the first time COND "
                   "holds: rss>SIZE, heap>SIZE (outstanding), pressure (the memory cgroup above "
                   "its soft limit or memory.high, or its limit or OOM counters moving), "
                   "psi>PERCENT (memory PSI some avg10); repeatable")
    add_otlp_arguments(p, "every --push-interval and at detach")
    p.add_argument("--pprof-push", type=otlp_url, metavar="URL", help="send the profile as "
                   "gzip pprof to Pyroscope's ingest API (URL/ingest) every --push-interval and "
                   "at detach")
    p.add_argument("--push-interval", type=positive_float, default=60.0, metavar="S",
                   help="seconds between pushes (default 60)")
    p.add_argument("--version", action="version", version=f"memhook {__version__}")


def run_attach(argv: list[str]) -> int:
    from . import driver
    a = attach_parser().parse_args(argv)
    opts, pushers = tracing_setup(a)
    stop = {"reason": ""}

    def on_signal(signum, _frame):
        stop["reason"] = "interrupted" if signum == signal.SIGINT else "terminated"

    def on_snapshot(_signum, _frame):  # (taken by the run's loop: driver.py)
        stop["snapshots"] = stop.get("snapshots", 0) + 1

    # Installed before attaching: a Ctrl-C during attach means "detach as soon as attached".
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_snapshot)
    return driver.run(a, opts, stop, pushers)


def tracing_setup(a) -> tuple[Options, list]:
    """The session options and the pushers the arguments ask for; bad values are UsageErrors."""
    if a.top < 1:
        raise UsageError("--top must be at least 1")
    if a.max_wait is None:
        a.max_wait = LOSSLESS_MAX_WAIT_S if a.lossless else Options.max_wait_s
    if a.lossless and not a.max_wait:
        raise UsageError("--lossless needs a --max-wait above 0")
    opts = Options(depth=a.depth, min_size=a.min_size,
                   max_size=MAX_SIZE if a.max_size is None else a.max_size,
                   ring_bytes=a.ring_size, rings=a.rings, abandon_after_s=a.unhook_after,
                   sample_rate=a.sample_rate, library_dir=a.library_dir,
                   heap_census=a.heap_census, follow_forks=a.follow_fork,
                   max_wait_s=a.max_wait, lossless=a.lossless,
                   reachability=a.reachability, max_pause_ms=a.max_pause,
                   check_by=a.check_by, python_frames=a.python_frames,
                   pymalloc=a.pymalloc)
    try:
        opts.check()
        suppressions.check_arguments(a)  # (a bad file is said now, not after the session)
        a.conditions = [snapshot_when.parse(t) for t in a.snapshot_when]
        a.runtime = runtime_rules(a)
    except ValueError as e:
        raise UsageError(str(e)) from None

    pushers = []
    if a.otlp or a.pprof_push:
        from .. import push
        labels = dict(a.label)
        sinks = ([push.OtlpSink(a.otlp, labels)] if a.otlp else []) + \
            ([push.PyroscopeSink(a.pprof_push, labels)] if a.pprof_push else [])
        pushers = [push.Pusher([], sink, a.push_interval) for sink in sinks]
    return opts, pushers
