"""The consumer's capacity (issue 4, benchmark 5).

One target thread allocates at a set pace (malloc/free pairs from 16 call sites) for a few
seconds per step while memhook is attached with the default ring; the pace doubles until events
are dropped. Prints, per step, the rate achieved, the events dropped, and the consumer's own
throughput: events applied per second of its busy time (draining, ordering, aggregating).

    sudo .venv/bin/python benchmarks/consumer.py [--seconds 2] [-- memhook args]
"""
import argparse
import tempfile
from pathlib import Path

from driver import Target, build
from memhook.consumer.session import Options, Session


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--start", type=float, default=1e6, help="first pace, calls per second")
    a = ap.parse_args()
    t = Target(build("paced", Path(tempfile.mkdtemp())))
    s = Session(t.pid, Options())
    s.attach()
    print(f"{'pace calls/s':>13} {'achieved':>11} {'dropped':>9} {'consumer events/s':>18}")
    rate, first_drop = a.start, None
    try:
        while rate <= 512e6:
            before = s.consumer.totals()
            achieved = t.ask(f"pace {rate:.0f} {a.seconds}", "achieved")
            s.consumer.drain()
            after = s.consumer.totals()
            applied = after["events"] - before["events"]
            busy = (after["consumer_busy_ns"] - before["consumer_busy_ns"]) / 1e9
            dropped = after["dropped_events"] - before["dropped_events"]
            print(f"{rate:>13.3g} {achieved:>11.3g} {dropped:>9} "
                  f"{applied / busy if busy else 0:>18.3g}")
            if dropped and first_drop is None:
                first_drop = achieved
            if achieved < rate * 0.9:
                break  # the thread cannot go faster
            rate *= 2
    finally:
        s.detach("benchmark done")
        t.close()
    print("drops begin at " + (f"{first_drop:.3g} calls/s" if first_drop else
                               "no rate this thread reached"))


if __name__ == "__main__":
    main()
