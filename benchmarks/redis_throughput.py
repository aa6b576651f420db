"""Debian's redis-server under pipelined redis-benchmark, with and without memhook tracing every
allocation (issue 43: "redis-server at >= 0.90 of its throughput, median of 5 interleaved runs").

One redis-server process serves every run: each cycle runs redis-benchmark unprofiled, then
attaches memhook (full tracing, default settings), runs it again, and detaches. Throughput is
requests per second summed over the tests; the ratio is traced over unprofiled per cycle, and the
median ratio is the figure. Also redis-server's CPU time per request traced over alone (the same
requests; steadier than throughput where the client and memhook share the cores), and memhook's
CPU in each traced run. With --heaptrack, a second redis-server is measured the same way
under `heaptrack -p` once (heaptrack stays until the process ends).

    sudo .venv/bin/python benchmarks/redis_throughput.py [--cycles 5] [--requests 200000]
"""
import argparse
import csv
import io
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from driver import Session, cpu_s, free_port, spread

TESTS = "set,get,incr,lpush,lpop,sadd,hset,mset"


def start_redis(tmp: str, port: int) -> subprocess.Popen:
    p = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly",
                          "no", "--dir", tmp, "--bind", "127.0.0.1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                          text=True).stdout.strip() == "PONG":
            return p
        time.sleep(0.05)
    sys.exit("redis-server did not start")


def redis_server() -> tuple[str, int, subprocess.Popen]:
    """A redis-server of its own: its directory, its port, its process (or exits, saying what
    to install)."""
    if not shutil.which("redis-server") or not shutil.which("redis-benchmark"):
        sys.exit("needs Debian's redis-server and redis-tools (apt-get install redis-server)")
    tmp = tempfile.mkdtemp(prefix="mh-redis-")
    port = free_port()
    return tmp, port, start_redis(tmp, port)


def benchmark_command(port: int, requests: int, pipeline: int = 16, clients: int = 50) -> list:
    return ["redis-benchmark", "-p", str(port), "-q", "--csv", "-n", str(requests), "-P",
            str(pipeline), "-c", str(clients), "-r", "100000", "-t", TESTS]


def throughput(port: int, a) -> float:
    """Requests per second, summed over the tests."""
    out = subprocess.run(benchmark_command(port, a.requests, a.pipeline, a.clients),
                         capture_output=True, text=True, check=True).stdout
    rows = list(csv.reader(io.StringIO(out)))
    return sum(float(r[1]) for r in rows[1:] if len(r) > 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--pipeline", type=int, default=16)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--heaptrack", action="store_true")
    a = ap.parse_args()
    tmp, port, redis = redis_server()
    bare, traced, ratios, dropped, waited = [], [], [], 0, 0
    cpu_ratios, consumer = [], []  # redis's CPU per request traced / alone; memhook's CPU
    try:
        throughput(port, a)  # warm: the keyspace filled, the allocator's arenas grown
        for i in range(a.cycles):
            c0 = cpu_s(redis.pid)
            b = throughput(port, a)
            cb = cpu_s(redis.pid) - c0
            mh = Session(redis.pid)
            c0, m0 = cpu_s(redis.pid), cpu_s(mh.p.pid)
            t = throughput(port, a)
            ct, cm = cpu_s(redis.pid) - c0, cpu_s(mh.p.pid) - m0
            mh.stop()
            bare.append(b)
            traced.append(t)
            ratios.append(t / b)
            cpu_ratios.append(ct / cb)  # (the same requests in both runs)
            consumer.append(cm)
            dropped += mh.dropped["events"]
            waited += mh.dropped["waited_events"]
            print(f"cycle {i + 1}: {b:,.0f} req/s alone, {t:,.0f} traced: {t / b:.2f}; "
                  f"redis's CPU per request {ct / cb:.2f}x, memhook's CPU {cm:.2f} s; "
                  f"attach {mh.attach_ms:.1f} ms, detach {mh.detach_ms:.1f} ms; dropped "
                  f"{mh.dropped['events']}, waited {mh.dropped['waited_events']}", flush=True)
    finally:
        redis.terminate()
        redis.wait(10)
    print(f"\nredis-server, redis-benchmark -P {a.pipeline} -c {a.clients} -n {a.requests} "
          f"-t {TESTS}:")
    print(f"  alone  {spread(bare, ' req/s', 0)}")
    print(f"  traced {spread(traced, ' req/s', 0)}")
    print(f"  ratio  {spread(ratios)} (median of {a.cycles} interleaved cycles); "
          f"dropped events: {dropped}, events that waited for room: {waited}")
    # Less noisy than throughput on a shared VM: what tracing adds to each request's CPU in
    # redis-server (the hooks, and what they cost redis's own code), and what memhook used.
    print(f"  redis-server's CPU per request, traced / alone: {spread(cpu_ratios)}; memhook's "
          f"CPU in a traced run: {spread(consumer, ' s')}")
    if a.heaptrack and shutil.which("heaptrack"):
        port = free_port()
        redis = start_redis(tmp, port)
        try:
            throughput(port, a)
            b = throughput(port, a)
            ht = subprocess.Popen(["heaptrack", "-p", str(redis.pid)], cwd=tmp,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            time.sleep(3)  # (heaptrack -p injects and starts writing)
            t = throughput(port, a)
        finally:
            redis.send_signal(signal.SIGTERM)
            redis.wait(30)
            said = ht.communicate(timeout=60)[0]
        # heaptrack's injection can fail where GDB cannot write the extended register state
        # (memhook's gdb_xstate.py works around it): it then traces nothing. It worked if it said
        # "injection finished" and counted allocations (GDB's complaints at its removal, once
        # the process has ended, do not matter).
        counted = re.search(r"allocations:\s+(\d+)", said)
        worked = "injection finished" in said and counted and int(counted.group(1)) > 0
        print(f"  heaptrack -p: {b:,.0f} req/s alone, {t:,.0f} traced: {t / b:.2f}"
              + ("" if worked else " (its injection failed: it traced nothing)"))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
