"""Allocation latency with and without memhook (issue 4, benchmark 1).

For each size from 16 B to 64 KiB: 100,000 mallocs (timed in batches of 1000, the batch freed
untimed), median of ROUNDS rounds, measured unprofiled and with memhook attached, alternating
CYCLES times in the same target process; prints ns/call and the ratio (attached / bare, medians
over cycles) per size, plus the events memhook dropped. The last row, "churn", times frees too:
each call frees one of 64 live blocks at random and allocates 16..271 bytes in its place.

    sudo .venv/bin/python benchmarks/alloc_latency.py [--cycles 3] [--rounds 5] [--depth 40]
                                                      [-- memhook args, e.g. --sample-rate 512KiB]

--depth N makes every malloc N frames deeper (benchmark 2: the backtrace's cost); --frameless
builds the target without frame pointers, so that every frame is unwound by its CFI rows.

--heaptrack also measures each size under heaptrack (Debian's; `heaptrack TARGET`, traced from
its start), alternating with an unprofiled target `--cycles` times: the same loop, both tools
recording every call with its backtrace.

--interleaved measures both in each attached session instead: batches of 1000 alternate between
the target's hooked GOT slot and copies of malloc/free the target took before memhook attached
(the same loop, only the function pointer differs), so the two see the same machine within
microseconds (this VM's speed drifts by up to 1.7x between seconds). The unprofiled batches then
run while memhook's consumer drains on the other CPU. Per cycle the median batch of each; the
ratio is the median over cycles of each cycle's ratio.
"""
import argparse
import shutil
import statistics
import tempfile
from collections import Counter
from pathlib import Path

from driver import Session, Target, alternate, build, print_dropped

SIZES = [16 << i for i in range(13)] + [0]  # 16 B .. 64 KiB, then churn (size 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--depth", type=int, default=0, help="extra frames above each malloc")
    ap.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=SIZES,
                    help="comma-separated sizes (default 16,32,...,65536,0; 0 is churn)")
    ap.add_argument("--verbose", action="store_true", help="also print every cycle's figures")
    ap.add_argument("--interleaved", action="store_true",
                    help="alternate unprofiled and hooked batches within each attached session")
    ap.add_argument("--frameless", action="store_true",
                    help="build the target without frame pointers (the walk goes by unwind rows)")
    ap.add_argument("--heaptrack", action="store_true",
                    help="also each size under heaptrack, against an unprofiled target")
    ap.add_argument("memhook_args", nargs="*", help="extra memhook options (after --)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    exe = build("alloc_latency", tmp, "-fno-plt", *(["-fomit-frame-pointer"] if a.frameless else []))
    t = Target(exe)
    sizes = a.sizes
    if a.interleaved:
        bare, hooked, dropped = interleaved(t, a, sizes)
    else:
        bare, hooked, dropped, _ = alternate(
            t.pid, a.cycles, a.memhook_args, sizes,
            lambda s: t.ask(f"run {s} {a.count} {a.rounds} {a.depth}", "ns"))
    assert t.close() == 0
    # Medians over cycles, and the best cycle of each (this VM's neighbours come and go: the
    # best figures show the cost undisturbed).
    print(f"{'size':>8} {'bare ns':>9} {'memhook ns':>11} {'ratio':>7} {'best bare':>10} "
          f"{'best memhook':>13} {'ratio':>7}")
    for s in sizes:
        b, h = statistics.median(bare[s]), statistics.median(hooked[s])
        bb, bh = min(bare[s]), min(hooked[s])
        ratio = (statistics.median(x / y for x, y in zip(hooked[s], bare[s])) if a.interleaved
                 else h / b)
        print(f"{s or 'churn':>8} {b:>9.1f} {h:>11.1f} {ratio:>6.2f}x {bb:>10.1f} {bh:>13.1f} {bh / bb:>6.2f}x" +
              (f"   bare {bare[s]} memhook {hooked[s]}" if a.verbose else ""))
    events = 2 * a.cycles * len(sizes) * a.count * a.rounds  # mallocs and frees while attached
    print_dropped(dropped, events)
    if a.heaptrack:
        versus_heaptrack(exe, tmp, a, sizes)


def versus_heaptrack(exe: str, tmp: Path, a, sizes):
    """Each size under heaptrack and unprofiled, in separate targets measured in turn (heaptrack
    traces a process from its start and stays to its end)."""
    if not shutil.which("heaptrack"):
        raise SystemExit("alloc_latency: heaptrack is not installed (apt-get install heaptrack)")
    bare = {s: [] for s in sizes}
    traced = {s: [] for s in sizes}
    plain = Target(exe)
    ht = Target("heaptrack", "-o", str(tmp / "heaptrack"), exe)
    for _ in range(a.cycles):
        for s in sizes:
            cmd = f"run {s} {a.count} {a.rounds} {a.depth}"
            bare[s].append(plain.ask(cmd, "ns"))
            traced[s].append(ht.ask(cmd, "ns"))
    assert plain.close() == 0 and ht.close(300) == 0
    print(f"\n{'size':>8} {'bare ns':>9} {'heaptrack ns':>13} {'ratio':>7}  (heaptrack TARGET, "
          f"{a.cycles} cycles alternated with an unprofiled target)")
    for s in sizes:
        b, h = statistics.median(bare[s]), statistics.median(traced[s])
        print(f"{s or 'churn':>8} {b:>9.1f} {h:>13.1f} {h / b:>6.2f}x")


def interleaved(t: Target, a, sizes):
    """Per size and cycle: the unprofiled and the hooked figure, measured batch by batch
    alternately in one attached session."""
    bare = {s: [] for s in sizes}
    hooked = {s: [] for s in sizes}
    dropped = Counter()
    for _ in range(a.cycles):
        mh = Session(t.pid, *a.memhook_args)
        for s in sizes:
            got = t.answers(f"pair {s} {a.count} {a.rounds} {a.depth}")
            bare[s].append(got["bare"])
            hooked[s].append(got["ns"])
        mh.stop()
        dropped.update(mh.dropped)
    return bare, hooked, dropped


if __name__ == "__main__":
    main()
