"""Python frames (issue 45): what reading them costs a Python program under full tracing.

A workload in the style of pyperformance's json and dict benchmarks (benchmarks/targets/
python_work.py: dicts, strings, json.dumps and json.loads), called at a Python stack depth of
10 or 50, timed inside the program between a "go" and its end, in fresh processes, in turn:

  alone       the program unprofiled;
  native      memhook -p --no-python-frames (pymalloc's calls traced, native stacks only);
  python      memhook -p (Python frames read at every allocation);
  lossless    memhook -p --lossless (with --lossless: a full ring makes the program wait, so
              nothing is dropped: the figure to hold against memray's, which never drops);
  arenas      memhook -p --no-pymalloc (malloc's calls only, pymalloc's objects seen as its
              arenas: what memray's default sees);
  memray      `memray run --native` on the same script (with --memray PYTHON: an interpreter
              with memray installed), which starts the program under it; it sees malloc only,
              pymalloc's arenas but not its objects (about 1 event in 1,000 of memhook's);
  memray+py   `memray run --native --trace-python-allocators`: the same events as memhook.
Both memray figures are over that interpreter's own unprofiled run in the same cycle.

Each traced figure is over the same cycle's unprofiled one; the cost per allocation of the
Python frames is (python - native) / the allocations memhook counted. Events dropped (a ring
full, default settings: the consumer's pace, issue 43) are the share of events memhook lost,
native / python; a run that drops does less work and looks faster than it is.

    sudo .venv/bin/python benchmarks/python_frames.py [--cycles 3] [--python PATH ...]
        [--depth 10 --depth 50] [--memray PATH] [--lossless]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from driver import HERE, spread

MEMHOOK = [sys.executable, "-m", "memhook"]
WORK = HERE / "targets" / "python_work.py"


def timed(python: str, depth: int, mode: str, tmp: Path, memray: str | None) -> tuple:
    """(seconds the workload took, allocations memhook counted, events it dropped)."""
    if mode.startswith("memray"):
        out = tmp / f"memray-{time.monotonic_ns()}.bin"
        cmd = [memray, str(WORK), str(depth), "--now"]
        if mode != "memray-alone":
            cmd[1:1] = ["-m", "memray", "run", "--native", "-q", "-o", str(out)] + \
                (["--trace-python-allocators"] if mode == "memray+py" else [])
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out.unlink(missing_ok=True)
        return float(r.stdout.split("elapsed")[1].split()[0]), 0, 0
    p = subprocess.Popen([python, str(WORK), str(depth)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, bufsize=1)
    assert p.stdout.readline().startswith("ready")
    mh = capture = None
    if mode != "alone":
        capture = tmp / f"capture-{time.monotonic_ns()}.mh"
        mh = subprocess.Popen(MEMHOOK + ["-p", str(p.pid), "--no-live", "-o", str(capture),
                                         "--no-reachability"]
                              + (["--no-python-frames"] if mode == "native" else [])
                              + (["--lossless"] if mode == "lossless" else [])
                              + (["--no-pymalloc"] if mode == "arenas" else []),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        while "attached" not in (mh.stdout.readline() or "attached"):
            pass
    p.stdin.write("go\n")
    p.stdin.flush()
    elapsed = float(p.stdout.readline().split()[1])
    p.stdin.close()
    p.wait()
    allocations = dropped = 0
    if mh:
        mh.communicate(timeout=120)
        rep = subprocess.run(MEMHOOK + ["report", str(capture), "--format", "json"],
                             capture_output=True, text=True, check=True, cwd="/")
        totals = json.loads(rep.stdout)["totals"]
        allocations, dropped = totals["alloc_count"], totals["dropped_events"]
        capture.unlink()
    return elapsed, allocations, dropped


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--python", action="append", default=[])
    ap.add_argument("--depth", type=int, action="append", default=[])
    ap.add_argument("--memray", help="a Python with memray installed (its version is timed "
                    "alone too, for memray's ratio)")
    ap.add_argument("--lossless", action="store_true", help="time memhook -p --lossless too")
    a = ap.parse_args()
    pythons = a.python or [str(p) for p in sorted(Path("/root/.pyenv/versions").glob(
        "3.1[0-3].*/bin/python3.1?")) + sorted(Path("/root/.pyenv/versions").glob(
            "3.[89].*/bin/python3.?"))]
    depths = a.depth or [10, 50]
    tmp = Path(tempfile.mkdtemp())
    print(f"{'python':<40} {'depth':>5}  {'alone s':>18}  {'native':>18}  {'python':>18}  "
          f"{'ns/alloc for frames':>22}")
    for python in pythons:
        for depth in depths:
            memray_modes = ("memray-alone", "memray", "memray+py") if a.memray else ()
            runs = {m: [] for m in ("alone", "native", "python", "lossless", "arenas")
                    + memray_modes}
            allocs, drops = [], {"native": [], "python": []}
            for _ in range(a.cycles):
                for mode in ("alone", "native", "python") + (("lossless",) if a.lossless else ()) \
                        + (("arenas",) if a.memray else ()) + memray_modes:
                    t, n, d = timed(a.memray if mode.startswith("memray") else python, depth,
                                    mode, tmp, a.memray)
                    runs[mode].append(t)
                    if mode in drops:
                        drops[mode].append(100 * d / max(n + d, 1))
                    if mode == "python":
                        allocs.append(n)
            ratio = {m: [t / b for t, b in zip(runs[m], runs["memray-alone" if m.startswith(
                "memray") else "alone"])] for m in runs if runs[m]}
            per = [(p - n) / c * 1e9 for p, n, c in zip(runs["python"], runs["native"], allocs)]
            name = python if len(python) <= 40 else "..." + python[-37:]
            print(f"{name:<40} {depth:>5}  {spread(runs['alone'], ' s', 3):>18}  "
                  f"{spread(ratio['native'], 'x'):>18}  {spread(ratio['python'], 'x'):>18}  "
                  f"{spread(per, ' ns', 0):>22}  {statistics.median(allocs):.0f} allocs, "
                  f"dropped {spread(drops['native'], '%', 0)} / {spread(drops['python'], '%', 0)}"
                  + (f"  lossless {spread(ratio['lossless'], 'x')}" if a.lossless else "")
                  + (f"  arenas {spread(ratio['arenas'], 'x')}"
                     f"  memray {spread(ratio['memray'], 'x')}"
                     f"  memray+py {spread(ratio['memray+py'], 'x')}" if a.memray else ""),
                  flush=True)


if __name__ == "__main__":
    main()
