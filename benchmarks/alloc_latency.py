"""Allocation latency with and without memhook (issue 4, benchmark 1).

For each size from 16 B to 64 KiB: 100,000 mallocs (timed in batches of 1000, the batch freed
untimed), median of ROUNDS rounds, measured unprofiled and with memhook attached, alternating
CYCLES times in the same target process; prints ns/call and the ratio (attached / bare, medians
over cycles) per size, plus the events memhook dropped.

    sudo .venv/bin/python benchmarks/alloc_latency.py [--cycles 3] [--rounds 5] [-- memhook args]
"""
import argparse
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
SIZES = [16 << i for i in range(13)]  # 16 B .. 64 KiB


class Target:
    def __init__(self, exe):
        self.p = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1)
        assert self.p.stdout.readline().startswith("ready")

    def run(self, size, count, rounds):
        self.p.stdin.write(f"run {size} {count} {rounds}\n")
        self.p.stdin.flush()
        value = None
        for line in self.p.stdout:
            if line.startswith("ns "):
                value = float(line.split()[1])
            elif line.startswith("done"):
                return value

    def close(self):
        self.p.stdin.write("exit\n")
        self.p.stdin.flush()
        return self.p.wait(10)


def attach(pid, extra):
    mh = subprocess.Popen([sys.executable, "-m", "memhook", "-p", str(pid), "--no-live",
                           "--format", "json", *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    line = mh.stdout.readline()
    if "attached" not in line:
        sys.exit(f"attach failed: {line}{mh.stderr.read()}")
    return mh


def detach(mh):
    mh.send_signal(signal.SIGINT)
    out, err = mh.communicate(timeout=120)
    m = re.search(r'"dropped_events": (\d+)', out)
    return int(m.group(1)) if m else -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("memhook_args", nargs="*", help="extra memhook options (after --)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    exe = tmp / "alloc_latency"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", str(exe),
                    str(HERE / "targets" / "alloc_latency.c")], check=True)
    t = Target(str(exe))
    bare = {s: [] for s in SIZES}
    hooked = {s: [] for s in SIZES}
    dropped = 0
    for _ in range(a.cycles):
        for s in SIZES:
            bare[s].append(t.run(s, a.count, a.rounds))
        mh = attach(t.p.pid, a.memhook_args)
        for s in SIZES:
            hooked[s].append(t.run(s, a.count, a.rounds))
        dropped += detach(mh)
    assert t.close() == 0
    print(f"{'size':>8} {'bare ns':>9} {'memhook ns':>11} {'ratio':>7}")
    for s in SIZES:
        b, h = statistics.median(bare[s]), statistics.median(hooked[s])
        print(f"{s:>8} {b:>9.1f} {h:>11.1f} {h / b:>6.2f}x")
    print(f"dropped events (all cycles): {dropped}")


if __name__ == "__main__":
    main()
