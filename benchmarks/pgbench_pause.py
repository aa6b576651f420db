"""How long memhook stops each process of PostgreSQL while pgbench keeps both cores busy.

Each cycle: a fresh cluster (Debian's PostgreSQL 15) is loaded by `pgbench -c 8 -j 2` for the
whole cycle; after a baseline, `memhook --pid-of postgres` attaches to every postgres process
(postmaster, background workers, the 8 backends), one after another, traces once all are
attached, and detaches with SIGINT.

Three figures per process and phase:
- the target's own, from the kernel's scheduler (`perf record -e sched:sched_switch`, when perf
  is installed): from the moment the process stopped for ptrace to the moment it ran its own code
  again, its runs of memhook's calls (dlopen, start, restore) and its wait for a CPU afterwards
  included; its runs while the agent waited for a thread to enter malloc (its own work) left
  out;
- memhook's own: from GDB's ptrace attach to its detach, less the time the target ran while GDB
  waited (the "target paused X ms" of each attached/detached line): an upper bound, since it
  also counts the time from the attach request to the moment the process stopped;
- the clients': pgbench's per-transaction log (`-l`). A transaction that was in flight while its
  backend was stopped took at least that long, so the longest transaction that ended within a
  phase, less the longest in the baseline, bounds from above what the pause added (it includes
  the CPU contention of GDB and memhook themselves on a 2-core machine).

    sudo .venv/bin/python benchmarks/pgbench_pause.py [--cycles 3] [--clients 8]
"""
import argparse
import glob
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from driver import NO_LEAK_CHECK, spread

BIN = Path("/usr/lib/postgresql/15/bin")


def as_postgres(*argv, **kw):
    return subprocess.run(["runuser", "-u", "postgres", "--", *map(str, argv)], **kw)


class Cluster:
    def __init__(self, tmp: Path, port: int):
        self.tmp, self.port, self.data = tmp, port, tmp / "pgdata"
        shutil.chown(tmp, "postgres")
        as_postgres(BIN / "initdb", "-D", self.data, "-A", "trust", "-U", "postgres",
                    check=True, capture_output=True)
        self.proc = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", str(BIN / "postgres"), "-D", str(self.data),
             "-p", str(port), "-k", str(tmp), "-c", "listen_addresses=", "-c",
             "max_connections=50"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if as_postgres(BIN / "pg_isready", "-h", tmp, "-p", port,
                           capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        self.bench("-i", "-s", "4", "-q")

    def bench(self, *args, **kw):
        return as_postgres(BIN / "pgbench", "-h", self.tmp, "-p", self.port, *args, "postgres",
                           check=True, capture_output=True, **kw)

    def load(self, clients: int, seconds: float, log_dir: Path):
        shutil.chown(log_dir, "postgres")
        return subprocess.Popen(
            ["runuser", "-u", "postgres", "--", str(BIN / "pgbench"), "-h", str(self.tmp), "-p",
             str(self.port), "-c", str(clients), "-j", "2", "-T", str(int(seconds)), "-l",
             "--log-prefix", str(log_dir / "tx"), "postgres"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self):
        # Fast shutdown: the postmaster's children go with it (runuser passes no signal on).
        as_postgres(BIN / "pg_ctl", "stop", "-D", self.data, "-m", "fast", "-w",
                    capture_output=True)
        self.proc.wait(20)


def transactions(log_dir: Path):
    """(end time in s, latency in ms) of every transaction pgbench logged."""
    out = []
    for name in glob.glob(str(log_dir / "tx*")):
        with open(name) as f:
            for line in f:
                w = line.split()
                out.append((int(w[4]) + int(w[5]) / 1e6, int(w[2]) / 1000.0))
    return out


def longest(tx, t0, t1) -> float:
    return max((lat for end, lat in tx if t0 <= end < t1), default=float("nan"))


class SchedTrace:
    """Every context switch of the machine, timed by CLOCK_MONOTONIC (time.monotonic())."""

    def __init__(self, tmp: Path):
        self.data = tmp / "sched.data"
        self.proc = subprocess.Popen(
            ["perf", "record", "-q", "-e", "sched:sched_switch", "--filter",
             'prev_comm == "postgres" || next_comm == "postgres"', "-a", "-k", "mono", "-m",
             "16M", "-o", str(self.data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # (recording)

    def stop(self) -> list:
        """(time, pid that left the CPU, its state, pid that took it) of every switch."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        out = subprocess.run(["perf", "script", "-i", str(self.data), "-F", "time,trace"],
                             capture_output=True, text=True).stdout
        switches = []
        for m in re.finditer(r"([\d.]+): prev_comm=.*? prev_pid=(\d+) .*?prev_state=(\S+) ==> "
                             r"next_comm=.*? next_pid=(\d+)", out):
            switches.append((float(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4))))
        return switches


def stopped_ms(switches: list, pid: int, t0: float, t1: float, first_run_own: bool):
    """How long `pid` did not run its own code because of ptrace between t0 and t1: from its
    first switch out in a traced stop (state t) to the first sign after its last one that it ran
    (a switch in, or out: under load perf loses a few events), less its runs between two stops
    that were its own work: the agent letting it go until a thread enters malloc (at attach
    always the first run, with `first_run_own`; at detach when no thread was blocked in the
    kernel), told apart from memhook's calls by a sleep (S), which those never make. None if it
    never stopped."""
    events = [(t, p == pid, st) for t, p, st, n in switches if t0 <= t < t1 and pid in (p, n)]
    stops = [i for i, (_, out, st) in enumerate(events) if out and "t" in st]
    if not stops or stops[-1] + 1 == len(events):
        return None
    total = events[stops[-1] + 1][0] - events[stops[0]][0]
    for k, (a, b) in enumerate(zip(stops, stops[1:])):
        if (first_run_own and k == 0) or any(out and st == "S" for _, out, st in events[a + 1:b]):
            total -= events[b][0] - events[a + 1][0]
    return total * 1000.0


def cycle(a, tmp: Path) -> dict:
    cluster = Cluster(tmp, a.port)
    logs = tmp / "logs"
    logs.mkdir()
    try:
        load = cluster.load(a.clients, 600, logs)  # (ended with the cluster)
        time.sleep(1.0)  # connections made, the backends forked
        b0 = time.time()
        time.sleep(a.baseline)
        sched = SchedTrace(tmp) if shutil.which("perf") else None
        m_attach = time.monotonic()
        t_attach = time.time()
        expected = len(subprocess.run(["pgrep", "-x", "postgres"], capture_output=True,
                                      text=True).stdout.split())
        mh = subprocess.Popen([sys.executable, "-m", "memhook", "--pid-of", "postgres",
                               "--no-live", "--format", "json", "--interval", "1", *NO_LEAK_CHECK],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd="/")
        lines, attached = [], threading.Event()

        def read():
            for line in mh.stdout:
                lines.append(line)
                if sum("attached to PID" in x for x in lines) >= expected:
                    attached.set()
        reader = threading.Thread(target=read)
        reader.start()
        # One after another, about a second each; a process that was counted and exited before
        # its turn (an autovacuum worker) is never attached: 5 s without one ends the wait.
        count, since = 0, time.monotonic()
        while not attached.wait(0.5) and time.monotonic() - since < 5:
            now = sum("attached to PID" in x for x in lines)
            if now != count:
                count, since = now, time.monotonic()
        time.sleep(a.trace)
        t_detach, m_detach = time.time(), time.monotonic()
        mh.send_signal(signal.SIGINT)
        mh.wait(120)
        reader.join()
        out, err = "".join(lines), ""
        t_end, m_end = time.time(), time.monotonic()
        switches = sched.stop() if sched else []
    finally:
        cluster.close()
        load.wait(60)
    attach = [float(x) for x in re.findall(r"attached.*paused ([\d.]+) ms", out + err)]
    detach = [float(x) for x in re.findall(r"detached.*paused ([\d.]+) ms", out + err)]
    if not attach:
        sys.exit(f"memhook attached to nothing:\n{out[-2000:]}\n{err[-2000:]}")
    tx = transactions(logs)
    base = longest(tx, b0, t_attach)
    if os.environ.get("PGBENCH_PAUSE_LOG"):
        Path(os.environ["PGBENCH_PAUSE_LOG"]).write_text(out + err)
    # The scheduler's view, per attached process (each a first attach: dlopen after a wait for
    # malloc's entry).
    pids = [int(x) for x in re.findall(r"attached to PID (\d+)", out)]
    seen = [(stopped_ms(switches, p, m_attach, m_detach, True),
             stopped_ms(switches, p, m_detach, m_end, False)) for p in pids] if switches else []
    return {"processes": len(attach), "attach": attach, "detach": detach,
            "seen_attach": [x for x, _ in seen if x is not None],
            "seen_detach": [y for _, y in seen if y is not None],
            "tx_base": base, "tx_attach": longest(tx, t_attach, t_detach),
            "tx_detach": longest(tx, t_detach, t_end),
            "tps_base": sum(1 for e, _ in tx if b0 <= e < t_attach) / (t_attach - b0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--baseline", type=float, default=3.0)
    ap.add_argument("--trace", type=float, default=3.0)
    ap.add_argument("--port", type=int, default=55432)
    a = ap.parse_args()
    if os.geteuid() != 0 or not (BIN / "postgres").exists():
        sys.exit("needs root and Debian's postgresql-15 (apt-get install postgresql)")
    rows = []
    for i in range(a.cycles):
        tmp = Path(tempfile.mkdtemp(prefix="mh-pgbench-"))
        try:
            r = cycle(a, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rows.append(r)
        print(f"cycle {i + 1}: {r['processes']} processes, {r['tps_base']:.0f} tps alone; "
              f"pause attach max {max(r['seen_attach'] or r['attach']):.1f} ms, detach max "
              f"{max(r['seen_detach'] or r['detach'] or [float('nan')]):.1f} ms; longest transaction "
              f"{r['tx_base']:.1f} ms alone, {r['tx_attach']:.1f} attaching/tracing, "
              f"{r['tx_detach']:.1f} detaching", flush=True)
    att = [x for r in rows for x in r["attach"]]
    det = [x for r in rows for x in r["detach"]]
    print(f"\nevery process, every cycle ({len(att)} attaches, {len(det)} detaches):")
    for name, key in (("attach", "seen_attach"), ("detach", "seen_detach")):
        seen = [x for r in rows for x in r[key]]
        if seen:
            print(f"  {name} pause as the scheduler saw it: {spread(seen, ' ms', 1)}; over 20 ms: "
                  f"{sum(x > 20 for x in seen)} of {len(seen)}")
    print(f"  attach pause as memhook told it: {spread(att, ' ms', 1)}; over 20 ms: "
          f"{sum(x > 20 for x in att)}")
    print(f"  detach pause as memhook told it: {spread(det, ' ms', 1)}; over 20 ms: "
          f"{sum(x > 20 for x in det)}")
    print("  longest pgbench transaction, alone / attach+trace / detach: "
          f"{spread([r['tx_base'] for r in rows], ' ms', 1)} / "
          f"{spread([r['tx_attach'] for r in rows], ' ms', 1)} / "
          f"{spread([r['tx_detach'] for r in rows], ' ms', 1)}")


if __name__ == "__main__":
    main()
