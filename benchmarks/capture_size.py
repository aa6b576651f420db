"""Capture size of a session on a busy process (issue 3): a target allocating and freeing from
about 2,000 call stacks in two threads is traced for SECONDS at the default --interval and
--snapshot-interval; the capture's size is printed with its growth per hour.

    sudo .venv/bin/python benchmarks/capture_size.py [--seconds 120]
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from driver import build


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    target = subprocess.Popen([build("busy", tmp)], stdout=subprocess.PIPE, text=True)
    assert target.stdout.readline().startswith("ready")
    out = tmp / "busy.mh"
    try:
        proc = subprocess.run([sys.executable, "-m", "memhook", "-p", str(target.pid), "--no-live",
                               "--duration", str(a.seconds), "-o", str(out), "--format", "json"],
                              capture_output=True, text=True, cwd="/", timeout=a.seconds + 120)
    finally:
        target.send_signal(signal.SIGKILL)
        target.wait()
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    import json
    rep = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])
    t = rep["totals"]
    size = os.path.getsize(out)
    print(f"traced {a.seconds:.0f} s: {t['alloc_count']} allocations "
          f"({t['alloc_count'] / a.seconds:.0f}/s), {len(rep['sites'])} call stacks, "
          f"{t['dropped_events']} events dropped")
    print(f"capture: {size} bytes, {size / a.seconds * 3600 / 1e6:.1f} MB per hour of tracing")


if __name__ == "__main__":
    main()
