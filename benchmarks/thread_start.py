"""Threads' first events (issue 43): N threads started at once, each making one malloc, with
and without memhook attached, alternating --cycles times in the same process. A thread's first
event claims a ring and finds its stack's bounds (hook_library/thread_state.h); prints the
microseconds per thread from the first pthread_create until every thread's malloc returned,
for each start in turn: a session's first start also faults in the rings it claims.

    sudo .venv/bin/python benchmarks/thread_start.py [--cycles 5] [--threads 50,50,400]
"""
import argparse
import tempfile
from pathlib import Path

from driver import NO_LEAK_CHECK, Target, alternate, build, spread


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--threads", default="50,50,400", help="the starts, in order")
    a = ap.parse_args()
    starts = list(enumerate(int(n) for n in a.threads.split(",")))
    t = Target(build("thread_start", Path(tempfile.mkdtemp()), "-pthread"))
    try:
        bare, hooked, _, _ = alternate(t.pid, a.cycles, NO_LEAK_CHECK, starts,
                                       lambda k: t.ask(f"start {k[1]}", "us_per_thread"))
    finally:
        t.close()
    print(f"{'start':>5} {'threads':>8}  {'alone, us/thread':>22}  {'memhook -p, us/thread':>24}  "
          "ratio")
    for k in starts:
        ratios = [h / b for b, h in zip(bare[k], hooked[k])]
        print(f"{k[0] + 1:>5} {k[1]:>8}  {spread(bare[k], digits=1):>22}  "
              f"{spread(hooked[k], digits=1):>24}  {spread(ratios, 'x')}")


if __name__ == "__main__":
    main()
