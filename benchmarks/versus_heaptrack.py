"""memhook and heaptrack on the same short program (issue 43): the program of 400 threads, each
making 1,001 allocations and freeing them (targets/thread_churn.c), run alone, under
`heaptrack` and under `memhook run`, in turn, `--repeats` times; then each tool's report of its
own recording (`heaptrack_print`, `memhook report`, text and HTML).

Prints, per measure, the median and the spread (min-max) over the repeats, and the ratios the
issue sets bars on: memhook run / heaptrack end to end (bar 1.5x), the program's own time under
memhook / alone (bar 2x), memhook report / heaptrack_print (bar 1x), and each tool's peak RSS
(the largest process of its tree: wait4's ru_maxrss; under `memhook run` that is the program,
whose RSS holds the rings it wrote into, so memhook's own process is read apart, from VmHWM,
and beside the rings, from RssAnon + RssFile: the bar is 64 MiB plus the rings written).

    sudo .venv/bin/python benchmarks/versus_heaptrack.py [--repeats 5] [--threads 400]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from driver import build

MEMHOOK = [sys.executable, "-m", "memhook"]


def own_peak(pid: int, peak: list) -> None:
    """The process's own peak RSS (VmHWM, KiB), read until it is gone, into peak[0]; into
    peak[1], the most it held besides shared memory (RssAnon + RssFile, sampled every 2 ms):
    what it holds beyond the rings it reads, which the issue's bar leaves out."""
    while True:
        try:
            with open(f"/proc/{pid}/status") as f:
                v = {k: int(rest.split()[0]) for k, _, rest in
                     (line.partition(":") for line in f) if k in ("VmHWM", "RssAnon", "RssFile")}
            hwm, own = v["VmHWM"], v["RssAnon"] + v["RssFile"]
        except (OSError, KeyError, ValueError):
            return
        peak[0], peak[1] = max(peak[0], hwm), max(peak[1], own)
        time.sleep(0.002)


def timed(cmd, own=None, **kw) -> tuple[float, int, str]:
    """Wall seconds, peak RSS in KiB of the command's process tree, its standard error; with
    `own` (a list), the command's own process's peak RSS in own[0]."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)
    if own is not None:
        own[:] = [0, 0]
        watcher = threading.Thread(target=own_peak, args=(p.pid, own), daemon=True)
        watcher.start()
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"{cmd[0]} exited with {p.returncode}:\n{err[-2000:]}")
    return wall, usage.ru_maxrss, err


def own_time(err: str) -> float:
    return float(re.search(r"thread_churn: ([\d.]+) s", err).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=400)
    ap.add_argument("--allocations", type=int, default=1001)
    a = ap.parse_args()
    if not shutil.which("heaptrack"):
        raise SystemExit("versus_heaptrack: heaptrack is not installed (apt-get install heaptrack)")
    tmp = Path(tempfile.mkdtemp(prefix="versus-heaptrack-"))
    prog = [build("thread_churn", tmp), str(a.threads), str(a.allocations)]
    m: dict[str, list[float]] = {}

    def add(key, value):
        m.setdefault(key, []).append(value)

    for i in range(a.repeats):
        wall, _, err = timed(prog)
        add("program alone, wall s", wall)
        add("program alone, own s", own_time(err))
        order = ["heaptrack", "memhook"] if i % 2 == 0 else ["memhook", "heaptrack"]
        for tool in order:
            out = tmp / f"{tool}{i}"
            if tool == "heaptrack":
                wall, rss, err = timed(["heaptrack", "-o", str(out), *prog])
                add("heaptrack run, s", wall)
                add("program under heaptrack, own s", own_time(err))
                add("heaptrack run, peak RSS MiB", rss / 1024)
                data = next(tmp.glob(f"heaptrack{i}.*"))
                wall, rss, _ = timed(["heaptrack_print", str(data)])
                add("heaptrack_print, s", wall)
                add("heaptrack_print, peak RSS MiB", rss / 1024)
            else:
                own = []
                wall, rss, err = timed([*MEMHOOK, "run", "--no-live", "-o", str(out), "--", *prog],
                                       own=own)
                add("memhook run, s", wall)
                add("program under memhook, own s", own_time(err))
                add("memhook run, peak RSS MiB (largest process)", rss / 1024)
                add("memhook run, memhook's own peak RSS MiB", own[0] / 1024)
                add("memhook run, memhook's peak RSS beside the rings MiB", own[1] / 1024)
                for fmt in ("text", "html"):
                    wall, rss, _ = timed([*MEMHOOK, "report", str(out), "--format", fmt,
                                          "-o", str(tmp / f"r{i}.{fmt}")])
                    add(f"memhook report {fmt}, s", wall)
                    add(f"memhook report {fmt}, peak RSS MiB", rss / 1024)
    width = max(map(len, m))
    print(f"{a.threads} threads x {a.allocations} allocations, {a.repeats} repeats "
          "(median, min-max)")
    for k, v in m.items():
        print(f"  {k:<{width}}  {statistics.median(v):8.3f}  ({min(v):.3f}-{max(v):.3f})")

    def ratio(num, den):
        r = [x / y for x, y in zip(m[num], m[den])]  # paired: the same repeat
        return f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})"
    print("ratios, paired per repeat (median, min-max):")
    print(f"  memhook run / heaptrack run, end to end:      {ratio('memhook run, s', 'heaptrack run, s')}"
          "  (bar 1.5x)")
    print(f"  program under memhook / alone, own time:      "
          f"{ratio('program under memhook, own s', 'program alone, own s')}  (bar 2x)")
    print(f"  memhook report text / heaptrack_print:        "
          f"{ratio('memhook report text, s', 'heaptrack_print, s')}  (bar 1x)")
    print(f"  memhook report html / heaptrack_print:        "
          f"{ratio('memhook report html, s', 'heaptrack_print, s')}")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
