"""Events memhook drops on a busy host (issue 19, part 2): a target whose two threads allocate
and free continuously (targets/busy.c), one CPU hog per core beside it, and memhook at nice 19.
Each session runs DURATION seconds; prints dropped events and dropped frees per session, how
many were dropped in the first second, and what the reconciliation at detach made of the
dropped frees: blocks found freed in the address table, blocks it could not tell (uncertain).
The target holds at most 2 x 4096 blocks live, plus one leaked in a thousand.

    sudo .venv/bin/python benchmarks/pressure.py [--sessions 3] [--duration 5]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from driver import build


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    a = ap.parse_args()
    exe = build("busy", Path(tempfile.mkdtemp()))
    target = subprocess.Popen([exe], stdout=subprocess.PIPE, text=True)
    assert target.stdout.readline().startswith("ready")
    hogs = [subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"])
            for cpu in range(os.cpu_count())]
    try:
        for _ in range(a.sessions):
            out = subprocess.run(["nice", "-n", "19", sys.executable, "-m", "memhook", "-p",
                                  str(target.pid), "--no-live", "--format", "json",
                                  "--duration", str(a.duration), "--interval", "1"],
                                 capture_output=True, text=True, cwd="/", check=True).stdout
            rep = json.loads(out[out.index("\n{") + 1:])
            t = rep["totals"]
            first = next((r["dropped_events"] for r in rep.get("timeseries", [])), None)
            print(f"events {t['alloc_count'] + t['free_count']}, dropped {t['dropped_events']} "
                  f"({t['dropped_frees']} frees); dropped by the first sample (1 s): {first}; "
                  f"outstanding {t['outstanding_count']} blocks; dropped frees found in the "
                  f"address table {t['reconciled_frees']}, uncertain {t['uncertain_count']} "
                  f"blocks ({t['uncertain_bytes']} B), unchecked {t['dropped_frees_unchecked']}")
    finally:
        for h in hogs:
            h.kill()
        target.kill()


if __name__ == "__main__":
    main()
