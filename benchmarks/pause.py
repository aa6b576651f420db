"""How long memhook stops the target: attach and detach, measured by the target itself.

The target (targets/stall.c) runs a thread that wakes every millisecond and records the longest
gap between wake-ups, plus idle threads doing a little malloc/free. For each cycle this attaches
memhook, asks the target for the longest gap (the attach pause), detaches with SIGINT and asks
again (the detach pause). The gap includes the detector's own 1 ms period and scheduling noise;
the unprofiled baseline gap is measured the same way first.

    sudo .venv/bin/python benchmarks/pause.py [--cycles 10] [--threads 8]
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

from driver import NO_LEAK_CHECK, Session, Target, build


def summary(xs):
    return f"median {statistics.median(xs):6.1f} ms   max {max(xs):6.1f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args()
    t = Target(build("stall", Path(tempfile.mkdtemp())), str(a.threads))
    baseline = []
    for _ in range(a.cycles):
        t.ask("reset")
        time.sleep(0.5)
        baseline.append(t.ask("max", "max") / 1000.0)
    seen = {"attach": [], "detach": []}
    told = {"attach": [], "detach": []}
    for _ in range(a.cycles):
        t.ask("reset")
        mh = Session(t.pid, *NO_LEAK_CHECK)
        told["attach"].append(mh.attach_ms)
        seen["attach"].append(t.ask("max", "max") / 1000.0)
        t.ask("reset")
        mh.stop()
        told["detach"].append(mh.detach_ms)
        time.sleep(0.1)
        seen["detach"].append(t.ask("max", "max") / 1000.0)
    assert t.close() == 0
    print(f"target: {a.threads} idle threads + 1 stall detector; {a.cycles} cycles")
    print(f"longest gap, not attached   : {summary(baseline)}")
    for k in ("attach", "detach"):
        print(f"{k} pause seen by the target: {summary(seen[k])}")
        print(f"{k} pause timed by memhook  : {summary(told[k])}")


if __name__ == "__main__":
    main()
