"""memhook's own CPU and memory over a long sampling session (issue 21): targets/busy.c (one
thread, ~2,000 call stacks, allocating and freeing continuously, leaking one block in a
thousand) under `memhook --sample-rate 512KiB --push-interval 60 --otlp ...`, as a fleet runs
it. Every minute: memhook's RSS and CPU time (from /proc), the target's; at the end the RSS
growth over the second half of the run, extrapolated to 8 hours.

    sudo .venv/bin/python benchmarks/long_session.py [--minutes 60] [--no-otlp] [--interval S]

--interval (memhook's, default 5 s) shortened runs many more samples through the in-memory
series in a short run: at 0.05 s, 10 minutes are the samples of 16.7 hours at the default.

With the Collector scripts/setup.sh --tests builds (.venv/otelcol) pushes go to it; with
--no-otlp, or without it, no pushes.
"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from driver import build, cpu_s
from otlp_push import COLLECTOR, collector, free_port


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def slope_per_hour(points: list) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / den * 3600 if den else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--every", type=float, default=60, help="seconds between samples")
    ap.add_argument("--no-otlp", action="store_true")
    ap.add_argument("--interval", default="5", help="memhook's --interval")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    col = None
    extra = []
    if not a.no_otlp and COLLECTOR.exists():
        port = free_port()
        col = collector(tmp, port)
        extra = ["--otlp", f"http://127.0.0.1:{port}", "--push-interval", "60",
                 "--label", "service=long-session"]
    target = subprocess.Popen([build("busy", tmp), "1", "256"], stdout=subprocess.PIPE,
                              text=True)
    assert target.stdout.readline().startswith("ready")
    seconds = a.minutes * 60
    out = open(tmp / "memhook.out", "w")
    mh = subprocess.Popen([sys.executable, "-m", "memhook", "-p", str(target.pid), "--no-live",
                           "--sample-rate", "512KiB", "--duration", str(seconds), "--interval", a.interval,
                           *extra],
                          stdout=out, stderr=subprocess.STDOUT, cwd="/")
    print(f"memhook PID {mh.pid} on busy PID {target.pid} for {a.minutes:g} min, --interval "
          f"{a.interval}"
          + (" pushing to a Collector every 60 s" if extra else ""), flush=True)
    print(f"{'min':>6} {'memhook RSS MiB':>16} {'memhook CPU s':>14} {'CPU % (last)':>13} "
          f"{'target CPU s':>13} {'target RSS MiB':>15}", flush=True)
    t0 = time.monotonic()
    rss, last_cpu, last_t = [], 0.0, t0
    try:
        while mh.poll() is None:
            time.sleep(a.every)
            try:
                now, c, r = time.monotonic(), cpu_s(mh.pid), rss_mib(mh.pid)
                tc, tr = cpu_s(target.pid), rss_mib(target.pid)
            except (OSError, StopIteration):
                break
            rss.append((now - t0, r))
            print(f"{(now - t0) / 60:6.1f} {r:16.1f} {c:14.1f} "
                  f"{100 * (c - last_cpu) / (now - last_t):13.2f} {tc:13.1f} {tr:15.1f}",
                  flush=True)
            last_cpu, last_t = c, now
        mh.wait()
    finally:
        target.kill()
        target.wait()
        if col:
            col.terminate()
    out.close()
    tail = (tmp / "memhook.out").read_text().splitlines()
    print("memhook said:", *[line for line in tail if line.startswith("memhook:")], sep="\n  ")
    if rss:
        half = [p for p in rss if p[0] >= rss[-1][0] / 2]
        growth = slope_per_hour(half)
        elapsed_h = rss[-1][0] / 3600
        print(f"memhook RSS {rss[0][1]:.1f} MiB after {rss[0][0] / 60:.0f} min, "
              f"{rss[-1][1]:.1f} MiB after {rss[-1][0] / 60:.0f} min; growth over the second "
              f"half {growth:+.2f} MiB/h; extrapolated to 8 h: "
              f"{rss[-1][1] + growth * (8 - elapsed_h):.1f} MiB; CPU {100 * last_cpu / (last_t - t0):.2f} % "
              "of one core on average")


if __name__ == "__main__":
    main()
