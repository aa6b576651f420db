"""How finely memhook times lifetimes (issue 20, part 2): tests/targets/lifetimes.c frees
blocks after delays it measures itself (12 µs to 96 ms, five each), once while its thread keeps
allocating ("busy") and once while it sleeps ("sleep"). Per delay and run: how many lifetimes
memhook put in a bucket (and whether it is the target's), and how many it knew only under a
bound. The consumer's cost is benchmarks/consumer.py's.

    sudo .venv/bin/python benchmarks/lifetimes.py [--runs 3]
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from driver import Session

from memhook import capture
from memhook.symbolize import Symbolizer

DELAYS_US = (12, 96, 384, 12000, 96000)  # the target's, as it sleeps or keeps busy
SOURCE = Path(__file__).parent.parent / "tests" / "targets" / "lifetimes.c"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    exe = tmp / "lifetimes"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-I", str(SOURCE.parent),
                    "-o", str(exe), str(SOURCE)], check=True)
    for mode in ("busy", "sleep"):
        totals: dict = {}
        for _ in range(a.runs):
            p = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, bufsize=1)
            assert p.stdout.readline().startswith("ready")
            mh = Session(p.pid, "-o", str(tmp / "cap.mh"), "--ring-size", "32MiB")
            p.stdin.write(mode + "\n")
            p.stdin.flush()
            lives = []
            for line in p.stdout:
                if line.startswith("done"):
                    break
                lives.append(int(line.split()[1]))
            mh.stop()
            p.stdin.write("exit\n")
            p.stdin.flush()
            p.wait()
            cap = capture.read(str(tmp / "cap.mh"))
            sym = Symbolizer(cap.modules)
            stack = next(s for s in range(1, cap.stack_count)
                         if sym.frame(int(cap.frames(s)[0])).function == "timed_block")
            resolved = cap.behaviour["lifetime_hist"][stack].astype(int).copy()
            under = cap.behaviour["lifetime_unresolved_hist"][stack].astype(int).copy()
            for d in range(5):
                row = totals.setdefault(d, [0, DELAYS_US[d]])
                for x in lives[5 * d:5 * d + 5]:
                    b = x.bit_length() - 1
                    if resolved[b]:
                        resolved[b] -= 1
                        row[0] += 1
            # What is left: lifetimes in another bucket than the target's, or under a bound.
            totals["other"] = totals.get("other", 0) + int(resolved.sum())
            totals["under"] = totals.get("under", 0) + int(under.sum())
        for d in range(5):
            print(f"{mode:6} {totals[d][1]:7d}µs  {totals[d][0]:3d} of {5 * a.runs} in "
                  "the target's bucket")
        print(f"{mode:6} all        in another bucket: {totals['other']}, under a bound: "
              f"{totals['under']} (of {25 * a.runs})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
