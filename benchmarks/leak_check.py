"""The leak check at detach (issue 44): how long it stops the target, and how fast it scans,
for heaps of 64 MiB, 1 GiB and 4 GiB (blocks of 64 B, 1 KiB and 4 KiB: about a million each),
both ways (--check-by fork: the target's copy read while it runs on; stop: read stopped),
beside a memcpy of the same bytes on this machine (numpy's copy).

Each heap is filled while memhook traces (the session's blocks), then memhook detaches and the
check runs with --max-pause 60s. One in 16 blocks is definitely lost; the benchmark checks the
count. The two ways alternate within each cycle.

    sudo .venv/bin/python benchmarks/leak_check.py [--cycles 3] [--sizes 64:64,1024:1024,4096:4096]
"""
import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from driver import HERE, Session, Target, spread


def memcpy_gib_s(mib: int) -> float:
    src = np.ones(mib << 17, np.uint64)  # touched
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return (mib / 1024) / best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--sizes", default="64:64,1024:1024,4096:4096",
                    help="MIB:BLOCK pairs (heap MiB, block bytes)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = str(Path(tmp) / "held_heap")  # (the tests' target: tests/integration/test_reachability.py)
        subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", exe,
                        str(HERE.parent / "tests" / "targets" / "held_heap.c")], check=True)
        for pair, how in ((p, h) for p in a.sizes.split(",") for h in ("fork", "stop")):
            mib, size = map(int, pair.split(":"))
            pauses, rates, parts = [], [], []
            for _ in range(a.cycles):
                t = Target(exe)
                mh = Session(t.pid, "--max-pause", "60000", "--check-by", how)
                blocks = int(t.ask(f"fill {mib} {size}", "blocks"))
                mh.stop()
                report = mh.report
                check = report["leak_check"]
                assert not check.get("skipped"), check
                lost = check["totals"]["definitely_lost_count"]
                dropped = report["totals"]["dropped_events"]
                # (the last lost block's address may linger in a register or a stack slot)
                assert blocks // 16 - 2 <= lost <= blocks // 16 or dropped, (lost, blocks)
                pauses.append(check["pause_ms"])
                assert bool(check.get("forked")) == (how == "fork"), check
                parts.append((check["stop_ms"], check["drain_ms"], check["scan_ms"],
                              check.get("fork_ms", 0.0), check.get("reap_ms", 0.0)))
                rates.append(check["bytes_read"] / 2**30 / (check["scan_ms"] / 1e3))
                t.p.kill()
                t.p.wait()
            med = [statistics.median(p[i] for p in parts) for i in range(5)]
            print(f"{how}: {mib} MiB in {blocks} blocks of {size} B ({dropped} events dropped): "
                  f"pause {spread(pauses, ' ms', 1)} (stop {med[0]:.1f}, consumer {med[1]:.1f}"
                  + (f", copy {med[3]:.1f} ms; after it: scan {med[2]:.0f} ms, reap "
                     f"{med[4]:.2f} ms)" if how == "fork" else f", scan {med[2]:.1f} ms)")
                  + f"; scan {spread(rates, ' GiB/s')}; memcpy "
                  f"{memcpy_gib_s(min(mib, 1024)):.1f} GiB/s", flush=True)


if __name__ == "__main__":
    main()
