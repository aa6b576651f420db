"""Threads allocating concurrently, with and without memhook (issue 4, benchmark 3).

1, 2, 4 and 8 threads each do OPS malloc/free pairs (16..271 bytes) over a private working set;
throughput (million calls per second, a pair counting as two) is measured unprofiled and with
memhook attached, alternating CYCLES times in the same process. Each thread writes its own ring,
so the ratio should not fall as threads are added (beyond what sharing the CPUs costs: more
threads than cores share them with the consumer too).

    sudo .venv/bin/python benchmarks/threads.py [--cycles 3] [--ops 20000000] [-- memhook args]
"""
import argparse
import statistics
import tempfile
from pathlib import Path

from driver import Target, alternate, build, print_dropped

THREADS = [1, 2, 4, 8]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--ops", type=int, default=20_000_000, help="malloc/free pairs per thread")
    ap.add_argument("memhook_args", nargs="*", help="extra memhook options (after --)")
    a = ap.parse_args()
    t = Target(build("threads", Path(tempfile.mkdtemp())))
    bare, hooked, dropped, _ = alternate(t.pid, a.cycles, a.memhook_args, THREADS,
                                         lambda n: 2 * t.ask(f"run {n} {a.ops}", "mops"))
    assert t.close() == 0
    print(f"{'threads':>8} {'bare Mcalls/s':>14} {'memhook Mcalls/s':>17} {'ratio':>7}")
    for n in THREADS:
        b, h = statistics.median(bare[n]), statistics.median(hooked[n])
        print(f"{n:>8} {b:>14.1f} {h:>17.1f} {h / b:>6.2f}")
    events = a.cycles * sum(THREADS) * a.ops * 2
    print_dropped(dropped, events)


if __name__ == "__main__":
    main()
