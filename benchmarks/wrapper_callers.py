"""A malloc wrapper's callers taking turns (xmalloc, zmalloc: one return address and one stack
pointer for every caller at one depth, so their stacks share a recent stack's key in the hooks).
For 1, 2, 4, 8 and 16 callers: ns per call alone, under `memhook run` and (--heaptrack) under
heaptrack, best batch of each run, median over --cycles runs in turn.

    sudo .venv/bin/python benchmarks/wrapper_callers.py [--cycles 3] [--heaptrack]
"""
import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from driver import build

CALLERS = (1, 2, 4, 8, 16)


def ns(cmd: list) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd="/").stdout
    return float(next(line for line in out.splitlines() if line.startswith("ns ")).split()[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--heaptrack", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    exe = build("wrapper_callers", tmp)
    tools = {"alone": [], "memhook run": [sys.executable, "-m", "memhook", "run", "--no-live",
                                          "-o", str(tmp / "capture.mh"), "--"]}
    if a.heaptrack:
        if not shutil.which("heaptrack"):
            raise SystemExit("wrapper_callers: heaptrack is not installed (apt-get install heaptrack)")
        tools["heaptrack"] = ["heaptrack", "-o", str(tmp / "heaptrack")]
    got = {(t, n): [] for t in tools for n in CALLERS}
    for _ in range(a.cycles):
        for n in CALLERS:
            for t, prefix in tools.items():
                got[t, n].append(ns([*prefix, exe, str(n)]))
    print(f"{'callers':>8}" + "".join(f"{t + ' ns':>16}" for t in tools) +
          "".join(f"{t + ' / alone':>20}" for t in tools if t != "alone"))
    for n in CALLERS:
        med = {t: statistics.median(got[t, n]) for t in tools}
        print(f"{n:>8}" + "".join(f"{med[t]:>16.1f}" for t in tools) +
              "".join(f"{med[t] / med['alone']:>19.2f}x" for t in tools if t != "alone"))


if __name__ == "__main__":
    main()
