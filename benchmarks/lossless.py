"""Full rings (issue 43): events dropped, events that waited, and how long the target's burst
took, for a burst of 1 M allocations from one thread (each freed at once but one in a thousand,
and every one kept) and for 64 threads at full speed on an idle host, and for the one-thread burst beside a CPU hog per core at nice -5 with memhook at nice 19
(the untraced burst beside them too).
Each case runs with memhook's default (a bounded wait, then dropping until half the ring is
empty), with --max-wait 0 (drop at once: memhook before this issue) and with --lossless; the
untraced burst in the same process comes first. Cases alternate, --repeats times.

    sudo .venv/bin/python benchmarks/lossless.py [--repeats 3]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS_TARGETS = Path(__file__).parent.parent / "tests" / "targets"
MODES = {"default": [], "max-wait 0": ["--max-wait", "0"], "lossless": ["--lossless"],
         "lossless 10ms": ["--lossless", "--max-wait", "10ms"]}
CASES = {"1 thread x 1 M": ("burst 1 1000000", None),
         "64 threads x 50 k": ("burst 64 50000", None),
         "1 M beside hogs": ("burst 1 1000000", "starved"),
         "1 M beside a hog": ("burst 1 1000000", "one"),
         "1 M kept": ("burst 1 1000000 1", None)}


class Target:
    def __init__(self, exe: str):
        self.proc = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout.readline().startswith("ready")

    def timed(self, command: str) -> float:
        t0 = time.perf_counter()
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done"
        return time.perf_counter() - t0

    def close(self) -> None:
        self.proc.stdin.write("exit\n")
        self.proc.stdin.close()
        self.proc.wait()


def hog(cpu: int, nice: int) -> subprocess.Popen:
    return subprocess.Popen(["nice", "-n", str(nice), "taskset", "-c", str(cpu), "sh", "-c",
                             "while :; do :; done"])


def start_hogs(hogs: str | None) -> list:
    if hogs == "starved":
        return [hog(c, -5) for c in range(os.cpu_count())]
    return [hog(0, 0)] if hogs == "one" else []


def stop(procs: list) -> None:
    for p in procs:
        p.kill()
        p.wait()


def untraced(target: Target, command: str, hogs: str | None) -> dict:
    busy = start_hogs(hogs)
    try:
        return {"s": target.timed(command), "dropped": 0, "waited": 0, "wait_ms": 0.0,
                "timeouts": 0, "longest_ms": 0.0}
    finally:
        stop(busy)


def traced(target: Target, command: str, args: list, hogs: str | None) -> dict:
    mh = subprocess.Popen([sys.executable, "-m", "memhook", "-p", str(target.proc.pid),
                           "--no-live", "--format", "json", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd="/")
    for line in mh.stdout:
        if line.startswith("memhook: attached"):
            break
    if hogs == "starved":  # memhook at nice 19 (each thread: nice is per thread), then the hogs
        for tid in os.listdir(f"/proc/{mh.pid}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), 19)
    busy = start_hogs(hogs)
    try:
        took = target.timed(command)
    finally:
        stop(busy)
    mh.send_signal(signal.SIGINT)
    out, err = mh.communicate(timeout=300)
    assert mh.returncode == 0, err
    t = json.loads(out[out.index("\n{") + 1:])["totals"]
    return {"s": took, "dropped": t["dropped_events"], "waited": t.get("waited_events", 0),
            "wait_ms": t.get("wait_ns", 0) / 1e6, "timeouts": t.get("wait_timeouts", 0),
            "longest_ms": t.get("wait_max_us", 0) / 1e3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--modes", default=",".join(MODES))
    a = ap.parse_args()
    exe = Path(tempfile.mkdtemp()) / "burst"
    subprocess.run(["gcc", "-O2", "-g", "-I", str(TESTS_TARGETS), str(TESTS_TARGETS / "burst.c"),
                    "-o", str(exe), "-lpthread"], check=True)
    results = {}
    for _ in range(a.repeats):
        for case in a.cases.split(","):
            command, hogs = CASES[case]
            for mode in ["untraced"] + a.modes.split(","):
                target = Target(str(exe))
                try:
                    if mode == "untraced":
                        r = untraced(target, command, hogs)
                    else:
                        r = traced(target, command, MODES[mode], hogs)
                finally:
                    target.close()
                results.setdefault((case, mode), []).append(r)
                print(f"{case:18} {mode:11} {r['s']:7.3f} s  dropped {r['dropped']:8}  waited "
                      f"{r['waited']:6} ({r['wait_ms']:.1f} ms, longest {r['longest_ms']:.1f} ms, "
                      f"{r['timeouts']} ran out)",
                      flush=True)
    print("\ncase               mode         burst s median (low-high)  dropped (each run)  "
          "waited (each run)")
    for (case, mode), rs in results.items():
        s = [r["s"] for r in rs]
        print(f"{case:18} {mode:11}  {statistics.median(s):.3f} ({min(s):.3f}-{max(s):.3f})"
              f"  {[r['dropped'] for r in rs]}  {[r['waited'] for r in rs]}")


if __name__ == "__main__":
    main()
