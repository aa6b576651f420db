"""What OTLP pushes cost the target (issue 21): targets/paced.c allocating as fast as it can
(malloc/free pairs from 16 call sites, 2 s per measure) under memhook without pushes, with a
push every second to a running OpenTelemetry Collector, and with pushes to a Collector that is
not there (each push fails after connecting is refused). The three sessions alternate, in the
same target, `--cycles` times; prints the target's own rate under each, as a ratio to the
session without pushes.

    sudo .venv/bin/python benchmarks/otlp_push.py [--cycles 3] [--sample-rate 512KiB]

Needs the Collector scripts/setup.sh --tests builds (.venv/otelcol).
"""
import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from driver import Session, Target, build

COLLECTOR = Path(__file__).parent.parent / ".venv" / "otelcol" / "otelcol-memhook"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collector(tmp: Path, port: int) -> subprocess.Popen:
    config = tmp / "otelcol.yaml"
    config.write_text(f"""receivers: {{otlp: {{protocols: {{http: {{endpoint: "127.0.0.1:{port}"}}}}}}}}
exporters: {{debug: {{verbosity: basic}}}}
service:
  telemetry: {{metrics: {{level: none}}}}
  pipelines: {{profiles: {{receivers: [otlp], exporters: [debug]}}}}
""")
    p = subprocess.Popen([str(COLLECTOR), "--config", str(config),
                          "--feature-gates=service.profilesSupport"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p
        except OSError:
            time.sleep(0.1)
    sys.exit("the Collector did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--sample-rate", default="")
    a = ap.parse_args()
    if not COLLECTOR.exists():
        sys.exit("no Collector: run scripts/setup.sh --tests")
    tmp = Path(tempfile.mkdtemp())
    up, down = free_port(), free_port()
    col = collector(tmp, up)
    t = Target(build("paced", tmp))
    extra = ["--sample-rate", a.sample_rate] if a.sample_rate else []
    modes = {"no pushes": [], "pushes every 1 s": ["--otlp", f"http://127.0.0.1:{up}"],
             "Collector down": ["--otlp", f"http://127.0.0.1:{down}"]}
    rates = {m: [] for m in modes}
    try:
        for _ in range(a.cycles):
            for mode, args in modes.items():
                mh = Session(t.pid, *extra, *args, "--push-interval", "1")
                time.sleep(1.2)  # a first push is under way
                rates[mode].append(t.ask("pace 1e9 2", "achieved"))
                mh.stop()
    finally:
        col.terminate()
        t.close()
    base = statistics.median(rates["no pushes"])
    for mode, xs in rates.items():
        print(f"{mode:18} median {statistics.median(xs) / 1e6:6.1f} M calls/s  "
              f"ratio {statistics.median(xs) / base:.3f}  "
              f"(runs: {', '.join(f'{x / 1e6:.1f}' for x in xs)})", flush=True)


if __name__ == "__main__":
    main()
