"""The consumer's own cost per event while redis-server serves pipelined redis-benchmark (issue
43: on two cores the consumer's time is taken from redis and its client, so the throughput bar
of redis_throughput.py is also a bar on this figure).

One redis-server, warmed by one benchmark run; memhook attached in this process (full tracing,
default settings); then redis-benchmark `--runs` times. Per run: the events applied (allocations
and frees), the consumer's busy time per event (draining, ordering, aggregating: its native
thread's clock around each drain), and the blocks live at the end (the live map's size).

    sudo .venv/bin/python benchmarks/redis_consumer.py [--runs 4] [--requests 200000]
"""
import argparse
import shutil
import subprocess
import time

from driver import spread
from memhook.consumer.session import Options, Session
from redis_throughput import benchmark_command, redis_server


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--requests", type=int, default=200_000)
    a = ap.parse_args()
    tmp, port, redis = redis_server()
    bench = benchmark_command(port, a.requests)
    per_event, session = [], None
    try:
        subprocess.run(bench, capture_output=True, check=True)  # the keyspace filled
        session = Session(redis.pid, Options())
        session.attach()
        for i in range(a.runs):
            before = session.consumer.totals()
            subprocess.run(bench, capture_output=True, check=True)
            time.sleep(0.1)  # (the consumer's last drains of the run)
            after = session.consumer.totals()
            events = sum(after[k] - before[k] for k in ("alloc_count", "free_count"))
            ns = (after["consumer_busy_ns"] - before["consumer_busy_ns"]) / max(events, 1)
            per_event.append(ns)
            print(f"run {i + 1}: {events:,} events, consumer {ns:.1f} ns an event, "
                  f"{after['outstanding_count']:,} blocks live", flush=True)
    finally:
        if session is not None:
            session.detach("benchmark done")
        redis.terminate()
        redis.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"consumer, ns an event: {spread(per_event, '', 1)} (the first run grows the live map)")


if __name__ == "__main__":
    main()
