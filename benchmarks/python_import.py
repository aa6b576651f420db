"""A Python program's imports under `memhook run` at default settings (issue 43: a burst of new
stacks; full tracing that loses nothing).

`python -c 'import numpy, matplotlib.pyplot, ssl, sqlite3, ctypes'` (about 2.9 M events and
200,000 distinct stacks with Python frames, one thread, in about a second) runs under
`memhook run --no-live -o CAPTURE` `--runs` times. Per run: the events it dropped (of those
applied and dropped), the ring waits, the consumer's own CPU time (its native thread, "memhook
drain": /proc's schedstat, read until it ends) and memhook's RSS beside shared memory while the
session ran (RssAnon + RssFile, sampled every 5 ms while that thread lives: the final report of
200,000 stacks comes after and is not in it), and the whole run's wall time, report included;
and the imports' own time, measured by the program, traced and alone (each traced run follows
an unprofiled one: the ratio is of the two).

    sudo .venv/bin/python benchmarks/python_import.py [--runs 3] [--python PATH]
"""
import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from driver import spread
from memhook import capture

CODE = "import numpy, matplotlib.pyplot, ssl, sqlite3, ctypes"
DRAIN = "memhook drain"  # the consumer's thread (hook_cpp/consumer/consumer.h)


def watch(pid: int, out: dict) -> None:
    """The drain thread's CPU seconds and the process's largest RssAnon + RssFile (MiB) while
    that thread lives, into out."""
    drain, seen = None, False
    out.update(cpu_s=0.0, rss_mib=0.0)
    while True:
        try:
            if drain is None:
                for task in glob.glob(f"/proc/{pid}/task/*"):
                    with open(f"{task}/comm") as f:
                        if f.read().strip() == DRAIN:
                            drain = task
            if drain is not None:
                with open(f"{drain}/schedstat") as f:
                    out["cpu_s"] = int(f.read().split()[0]) / 1e9
                seen = True
                with open(f"/proc/{pid}/status") as f:
                    v = {k: int(rest.split()[0]) for k, _, rest in
                         (line.partition(":") for line in f) if k in ("RssAnon", "RssFile")}
                out["rss_mib"] = max(out["rss_mib"], (v["RssAnon"] + v["RssFile"]) / 1024)
        except (OSError, ValueError, KeyError):
            if seen or not os.path.exists(f"/proc/{pid}"):
                return  # (the drain thread ended: the session is over)
        time.sleep(0.005)


def timed_code(out: Path) -> str:
    """CODE, timed by the program itself into `out` (seconds): the imports alone, without the
    interpreter's start or memhook's attach and report."""
    return (f"import time; t0 = time.perf_counter(); {CODE}; "
            f"open({str(out)!r}, 'w').write(repr(time.perf_counter() - t0))")


def alone(python: str, tmp: Path) -> float:
    out = tmp / "alone.s"
    subprocess.run([python, "-c", timed_code(out)], check=True, cwd="/")
    return float(out.read_text())


def one_run(python: str, tmp: Path) -> dict:
    cap, took = tmp / "import.mh", tmp / "traced.s"
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "memhook", "run", "--no-live", "-o", str(cap),
                          "--report-file", str(tmp / "report.txt"), "--", python, "-c",
                          timed_code(took)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/")
    seen: dict = {}
    watcher = threading.Thread(target=watch, args=(p.pid, seen), daemon=True)
    watcher.start()
    err = p.communicate()[1]
    wall = time.monotonic() - t0
    watcher.join(timeout=5)
    if p.returncode:
        sys.exit(f"memhook run failed ({p.returncode}): {err.strip()[-500:]}")
    totals = capture.read(str(cap)).meta.get("totals", {})
    report = (tmp / "report.txt").read_text()
    waits = next((line.strip() for line in report.splitlines() if "waited for room" in line), "")
    cap.unlink()
    return {"events": totals["alloc_count"] + totals["free_count"] + totals["dropped_events"],
            "dropped": totals["dropped_events"], "waits": waits, "wall": wall,
            "traced_s": float(took.read_text()), **seen}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--python", default=str(Path(sys.executable).with_name("python")),
                    help="an interpreter with numpy and matplotlib (default: this one's venv)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    runs = []
    for i in range(a.runs):
        bare = alone(a.python, tmp)
        r = one_run(a.python, tmp)
        r["ratio"] = r["traced_s"] / bare
        runs.append(r)
        print(f"run {i + 1}: {r['dropped']:,} of {r['events']:,} events dropped; consumer "
              f"{r['cpu_s']:.2f} s of CPU; memhook {r['rss_mib']:.0f} MiB beside the rings "
              f"in the session; {r['wall']:.1f} s end to end; the imports "
              f"{r['traced_s']:.2f} s traced, {bare:.2f} s alone ({r['ratio']:.2f}x)"
              + (f"\n       {r['waits']}" if r["waits"] else ""), flush=True)
    print(f"dropped: {spread([r['dropped'] for r in runs], '', 0)} events; consumer CPU "
          f"{spread([r['cpu_s'] for r in runs], ' s')}; RSS "
          f"{spread([r['rss_mib'] for r in runs], ' MiB', 0)}; wall "
          f"{statistics.median(r['wall'] for r in runs):.1f} s; the imports traced "
          f"{spread([r['ratio'] for r in runs], 'x')} their time alone")


if __name__ == "__main__":
    main()
