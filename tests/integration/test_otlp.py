"""Profiles to the OpenTelemetry Collector: a real Collector (built by scripts/setup.sh with the
Collector Builder: OTLP receiver, debug exporter) receives a capture's profile over OTLP/HTTP,
and its debug exporter's detailed output shows the leak's function, its exact in-use bytes and
the resource attributes."""
from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Memhook, build, run_memhook, site

COLLECTOR = Path(__file__).parents[2] / ".venv" / "otelcol" / "otelcol-memhook"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Collector:
    """The Collector on 127.0.0.1 with a profiles pipeline, its debug output in a file."""

    def __init__(self, tmp_path: Path, port: int = 0):
        if not COLLECTOR.exists():
            pytest.skip("no OpenTelemetry Collector: scripts/setup.sh builds it when Go is there")
        self.port = port or free_port()
        config = tmp_path / "otelcol.yaml"
        config.write_text(f"""receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{self.port}
exporters:
  debug:
    verbosity: detailed
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [otlp]
      exporters: [debug]
""")
        self.log = tmp_path / "otelcol.log"
        self.proc = subprocess.Popen([str(COLLECTOR), "--config", str(config),
                                      "--feature-gates=service.profilesSupport"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert self.proc.poll() is None, self.text()
                assert time.monotonic() < deadline, "the Collector did not listen"
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_bytes().replace(b"\0", b"").decode(errors="replace")

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)


def received(text: str) -> dict:
    """From the debug exporter's detailed dump of the last request: its string table, function
    names, resource attributes, and per profile its sample type and values."""
    last = text[text.rindex("String table:"):]
    table = []
    for line in last.split("\n")[1:]:
        if not line.startswith("    ") or line.startswith("     "):
            break
        table.append(line[4:])
    functions = [table[int(m)] for m in re.findall(r"Function #\d+\n    Name: (\d+)",
                                                    text[text.rindex("Mapping #0"):])]
    attrs = dict(re.findall(r"     -> ([\w.]+): (?:Str|Int)\(([^)]*)\)", last))
    profiles = re.split(r"\nProfile #\d+\n", last)[1:]
    types = [t for t in table if t in ("inuse_space", "inuse_objects", "alloc_space",
                                       "alloc_objects")]
    values = [[int(v) for v in re.findall(r"Values: \[(\d+)\]", p)] for p in profiles]
    return {"functions": functions, "attrs": attrs, "values": dict(zip(types, values))}


def test_capture_profile_arrives_in_the_collector(tmp_path, targets):
    collector = Collector(tmp_path)
    try:
        target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
        mh = Memhook(target.pid, tmp_path)
        target.command("go")  # late_leak: 7 blocks of 99 bytes
        report = mh.stop()
        leak = site(report, "late_leak")
        assert leak["outstanding_bytes"] == 693
        out = run_memhook("report", mh.capture, "--otlp", collector.url,
                          "--label", "service=checkout", "--label", "env=prod")
        assert out.returncode == 0 and "profile sent to" in out.stderr, out.stderr
        deadline = time.monotonic() + 10
        while "String table:" not in collector.text():
            assert time.monotonic() < deadline, collector.text()[-3000:]
            time.sleep(0.1)
        got = received(collector.text())
        assert "late_leak" in got["functions"], got
        assert 693 in got["values"]["inuse_space"] and 7 in got["values"]["inuse_objects"], got
        assert sum(got["values"]["inuse_space"]) == report["totals"]["outstanding_bytes"]
        assert got["attrs"]["service.name"] == "checkout" and got["attrs"]["env"] == "prod"
        assert got["attrs"]["process.pid"] == str(target.pid)
        assert got["attrs"]["process.executable.name"] == "lifecycle"
        assert "process.command_line" in got["attrs"] and "host.name" in got["attrs"]
    finally:
        collector.close()


def test_unreachable_collector_is_one_line(tmp_path, targets):
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    mh = Memhook(target.pid, tmp_path)
    mh.stop()
    out = run_memhook("report", mh.capture, "--otlp", f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "could not be reached" in out.stderr and "Traceback" not in out.stderr


def test_live_pushes_survive_a_collector_that_comes_late(tmp_path, targets):
    """`memhook -p PID --otlp URL --push-interval S`: while the Collector is not there yet,
    pushes fail (counted, retried, the session goes on); once it listens they arrive, and the
    one sent at detach holds the leak's exact bytes and the labels."""
    port = free_port()
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    mh = Memhook(target.pid, tmp_path, "--otlp", f"http://127.0.0.1:{port}", "--push-interval",
                 "0.5", "--label", "service=checkout")
    target.command("go")
    time.sleep(1.5)  # two or three pushes fail: nobody listens
    collector = Collector(tmp_path, port)
    try:
        deadline = time.monotonic() + 20
        while "String table:" not in collector.text():  # a retried push arrives
            assert time.monotonic() < deadline, collector.text()[-2000:]
            time.sleep(0.1)
        target.command("second")  # 4 calloc'd blocks of 4321 bytes
        report = mh.stop()
        summary = mh.lines.expect("profiles sent to", timeout=10)
        sent, failed = (int(x) for x in re.search(r"(\d+) profiles sent.*?(\d+) pushes failed",
                                                  summary).groups())
        assert sent >= 2 and failed >= 1, summary
        time.sleep(0.5)
        got = received(collector.text())
        assert sum(got["values"]["inuse_space"]) == report["totals"]["outstanding_bytes"] \
            == 693 + 4 * 4321, (got, report["totals"])
        assert {"late_leak", "second_leak"} <= set(got["functions"])
        assert got["attrs"]["service.name"] == "checkout"
    finally:
        collector.close()
