"""How long memhook stops the target: attach and detach, measured by the target itself.

The target (targets/stall.c) runs a thread that wakes every millisecond and records the longest
gap between wake-ups, plus idle threads doing a little malloc/free. For each cycle this attaches
memhook, asks the target for the longest gap (the attach pause), detaches with SIGINT and asks
again (the detach pause). The gap includes the detector's own 1 ms period and scheduling noise;
the unprofiled baseline gap is measured the same way first.

    sudo .venv/bin/python benchmarks/pause.py [--cycles 10] [--threads 8]
"""
import argparse
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


class Target:
    def __init__(self, exe, threads):
        self.p = subprocess.Popen([exe, str(threads)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1)
        assert self.p.stdout.readline().startswith("ready")

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        out = None
        for line in self.p.stdout:
            if line.startswith("max"):
                out = int(line.split()[1]) / 1000.0
            if line.startswith("done"):
                return out

    def close(self):
        self.p.stdin.write("exit\n")
        self.p.stdin.flush()
        return self.p.wait(10)


def summary(xs):
    return f"median {statistics.median(xs):6.1f} ms   max {max(xs):6.1f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    exe = tmp / "stall"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "targets" / "stall.c"), "-lpthread"],
                   check=True)
    t = Target(str(exe), a.threads)
    baseline = []
    for _ in range(a.cycles):
        t.ask("reset")
        time.sleep(0.5)
        baseline.append(t.ask("max"))
    seen = {"attach": [], "detach": []}
    told = {"attach": [], "detach": []}
    for _ in range(a.cycles):
        t.ask("reset")
        mh = subprocess.Popen([sys.executable, "-m", "memhook", "-p", str(t.p.pid), "--no-live"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        line = mh.stdout.readline()
        if "attached" not in line:
            sys.exit(f"attach failed: {line}{mh.stderr.read()}")
        told["attach"].append(float(re.search(r"paused ([\d.]+) ms", line).group(1)))
        seen["attach"].append(t.ask("max"))
        t.ask("reset")
        mh.send_signal(signal.SIGINT)
        out, err = mh.communicate(timeout=60)
        told["detach"].append(float(re.search(r"detached.*paused ([\d.]+) ms", out).group(1)))
        time.sleep(0.1)
        seen["detach"].append(t.ask("max"))
    assert t.close() == 0
    print(f"target: {a.threads} idle threads + 1 stall detector; {a.cycles} cycles")
    print(f"longest gap, not attached   : {summary(baseline)}")
    for k in ("attach", "detach"):
        print(f"{k} pause seen by the target: {summary(seen[k])}")
        print(f"{k} pause timed by memhook  : {summary(told[k])}")


if __name__ == "__main__":
    main()
