"""`memhook run` against `memhook -p` on the same workload (issue 34's numbers).

1. The 16 B ratio: benchmarks/targets/alloc_latency.c's "run 16 COUNT ROUNDS" (ns per 16-byte
   malloc) in three fresh processes per cycle, in turn: unprofiled, attached with `memhook -p`,
   started by `memhook run`; each traced figure over the same cycle's unprofiled one.
2. The time to the first traced allocation: `memhook run` from its start to the program's first
   malloc (a constructor in benchmarks/targets/first_alloc.c prints when), against the same
   program started without memhook; `memhook -p` from its start to its "attached" line.

    sudo .venv/bin/python benchmarks/run_mode.py [--cycles 5] [--count 100000] [--rounds 5]
"""
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from driver import Session, Target, batch_arguments, build, spread

MEMHOOK = [sys.executable, "-m", "memhook"]


def first_alloc_ms(exe: str, under_memhook: bool) -> float:
    """Milliseconds from starting the program (memhook run, or the bare program) to its first
    allocation."""
    cmd = MEMHOOK + ["run", "--no-live", "--", exe] if under_memhook else [exe]
    t0 = time.time_ns()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd="/", check=True).stdout
    first = int(next(line for line in out.splitlines() if line.startswith("first")).split()[1])
    return (first - t0) / 1e6


def attach_ms(exe: str) -> float:
    """Milliseconds from starting `memhook -p` to its "attached" line (tracing from there)."""
    t = Target(exe)
    t0 = time.monotonic()
    s = Session(t.pid)
    ms = (time.monotonic() - t0) * 1000
    s.stop()
    t.close()
    return ms


def main():
    ap = batch_arguments(__doc__, cycles=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    latency = build("alloc_latency", tmp, "-fno-plt")
    first = build("first_alloc", tmp)
    cmd = f"run 16 {a.count} {a.rounds}"
    ratios = {"-p": [], "run": []}
    starts = {"bare": [], "run": [], "-p": []}
    for _ in range(a.cycles):
        t = Target(latency)
        bare = t.ask(cmd, "ns")
        t.close()
        t = Target(latency)
        s = Session(t.pid)
        ratios["-p"].append(t.ask(cmd, "ns") / bare)
        s.stop()
        t.close()
        t = Target("env", "-C", "/", *MEMHOOK, "run", "--no-live", "--report-file", "/dev/null",
                   "--", latency)
        ratios["run"].append(t.ask(cmd, "ns") / bare)
        t.close()
        starts["bare"].append(first_alloc_ms(first, False))
        starts["run"].append(first_alloc_ms(first, True))
        starts["-p"].append(attach_ms(latency))
    print(f"16 B ratio, memhook -p:  {spread(ratios['-p'], 'x')}")
    print(f"16 B ratio, memhook run: {spread(ratios['run'], 'x')}")
    print(f"first allocation, bare program:  {spread(starts['bare'], ' ms', 1)}")
    print(f"first traced allocation, memhook run: {spread(starts['run'], ' ms', 1)}")
    print(f"memhook -p to attached: {spread(starts['-p'], ' ms', 1)}")
    print("medians: run's ratio over -p's "
          f"{statistics.median(ratios['run']) / statistics.median(ratios['-p']):.2f}")


if __name__ == "__main__":
    main()
