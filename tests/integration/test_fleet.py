"""Several processes in one run, and the pushes a fleet relies on (issue 21): `--pid-of NAME`
with a worker started after the run began, exact bytes per process in the capture, the merged
view and a real OpenTelemetry Collector; the Collector stopped mid-session and started again;
the request `--pprof-push` sends to Pyroscope's ingest API."""
from __future__ import annotations

import gzip
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from urllib.parse import parse_qs, urlparse

import pytest

from conftest import Lines, Memhook, build, memhook_cmd, report, report_json, run_memhook, site
from test_capture import go_cache
from test_otlp import Collector, received
from test_views import RAW_ADDRESS, open_in_chromium

LATE_LEAK = 7 * 99  # lifecycle.c's "go"


def resources(text: str) -> dict:
    """Per process.pid, from the Collector's dump of every request, the last profile received:
    the values of each of its profiles in order (inuse_space, inuse_objects, alloc_space,
    alloc_objects, and with the leak check definitely_lost_space). (A process that ended is in the push after its end; the final push holds
    those still traced then.)"""
    out = {}
    for part in re.split(r"\nResourceProfiles #\d+\n", text)[1:]:
        pid = int(re.search(r"process\.pid: Int\((\d+)\)", part).group(1))
        profiles = re.split(r"\nProfile #\d+\n", part)[1:]
        out[pid] = [sum(int(v) for v in re.findall(r"Values: \[(\d+)\]", p)) for p in profiles]
    return out


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_three_workers_one_started_later(tmp_path, targets):
    """`memhook --pid-of NAME -o FILE --otlp URL`: two workers running, a third started after
    the run began; each leaks a different number of blocks. Every one is in the capture with its
    exact bytes, the merged view adds them up at the one shared stack, `report --pid` reports a
    process alone, and the Collector receives each process as its own resource."""
    name = f"worker{os.getpid()}"
    exe = build(tmp_path, "lifecycle.c", name=name)
    collector = Collector(tmp_path)
    cap = tmp_path / "workers.mh"
    try:
        first = [targets(exe, "/nonexistent.so") for _ in range(2)]
        mh = subprocess.Popen(memhook_cmd("--pid-of", name, "-o", cap, "--no-live", "--otlp",
                                          collector.url, "--push-interval", "0.5", "--label",
                                          "service=workers"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        lines = Lines(mh.stdout)
        seen = {int(re.search(r"PID (\d+)", lines.expect("attached", 120)).group(1))
                for _ in first}
        assert seen == {t.pid for t in first}
        late = targets(exe, "/nonexistent.so")  # started while the run goes on
        assert f"PID {late.pid} " in lines.expect("attached", 120)
        workers = first + [late]
        for n, t in enumerate(workers, 1):
            for _ in range(n):
                t.command("go")
        time.sleep(1.0)  # a push after the last leak
        mh.send_signal(signal.SIGINT)
        summary = lines.expect("profiles sent to", 60)
        assert mh.wait(60) == 0, mh.stderr.read()
        assert int(summary.split()[1]) >= 1, summary
        for t in workers:
            assert t.proc.poll() is None  # untouched, still running
    finally:
        collector.close()

    rep = report_json(cap)
    import jsonschema
    from importlib import resources as res
    jsonschema.validate(rep, json.loads(res.files("memhook").joinpath("report.schema.json")
                                        .read_text()))
    assert sorted(p["pid"] for p in rep["processes"]) == sorted(t.pid for t in workers)
    for n, t in enumerate(workers, 1):
        proc = next(p for p in rep["processes"] if p["pid"] == t.pid)
        assert proc["outstanding_bytes"] == n * LATE_LEAK, proc
        alone = report_json(cap, "--pid", t.pid)
        assert alone["pid"] == t.pid
        assert site(alone, "late_leak")["outstanding_bytes"] == n * LATE_LEAK
    merged = site(rep, "late_leak")  # one stack in the merged view, not three
    assert merged["outstanding_bytes"] == 6 * LATE_LEAK == rep["totals"]["outstanding_bytes"]
    # Each process's leak check, summed per merged stack: every late_leak block is lost.
    assert merged["definitely_lost_bytes"] == 6 * LATE_LEAK
    assert {p["pid"]: p["outstanding_bytes"] for p in merged["processes"]} == \
        {t.pid: n * LATE_LEAK for n, t in enumerate(workers, 1)}
    assert len([s for s in rep["sites"] if s["frames"][0]["function"] == "late_leak"]) == 1
    text = run_memhook("report", cap).stdout
    assert "3 processes" in text and all(f"PID {t.pid}" in text for t in workers), text
    page = tmp_path / "workers.html"
    assert run_memhook("report", cap, "--format", "html", "-o", page).returncode == 0
    dom = open_in_chromium(tmp_path, page)
    assert "<h2>Processes</h2>" in dom and all(f"<td>{t.pid}</td>" in dom for t in workers)
    assert dom.count('style="left:') >= 2, "the flame graph was not drawn"
    assert not RAW_ADDRESS.search(re.sub(r"<script.*?</script>", "", dom, flags=re.S))

    # The final push carries the leak check at detach: a fifth profile, the bytes definitely
    # lost (lifecycle.c's late_leak drops its blocks' addresses).
    expected = {t.pid: [n * LATE_LEAK, n * 7, n * LATE_LEAK, n * 7, n * LATE_LEAK]
                for n, t in enumerate(workers, 1)}
    got = resources(collector.text())
    assert got == expected, got
    # The capture's request (`report --format otlp`): a resource per process, as live.
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceRequest)
    request = tmp_path / "workers.otlp"
    report(cap, "--format", "otlp", "-o", request)
    req = ExportProfilesServiceRequest.FromString(request.read_bytes())
    from_file = {next(a.value.int_value for a in r.resource.attributes if a.key == "process.pid"):
                 [sum(s.values[0] for s in p.samples) for p in r.scope_profiles[0].profiles]
                 for r in req.resource_profiles}
    assert from_file == expected, from_file
    dump = received(collector.text())
    assert "late_leak" in dump["functions"] and dump["attrs"]["service.name"] == "workers"


@pytest.mark.serial  # timing: measured with no other test beside it
def test_collector_stopped_mid_session_then_back(tmp_path, targets):
    """The Collector goes away while memhook pushes every 0.5 s, then comes back on the same
    port: the target's allocation loop keeps its pace throughout, memhook counts the failed
    pushes, and pushes arrive again once the Collector listens."""
    target = targets(build(tmp_path, "spinner.c"), 1)
    collector = Collector(tmp_path)
    port = collector.port
    mh = Memhook(target.pid, tmp_path, "--otlp", collector.url, "--push-interval", "0.5",
                 "--sample-rate", "64KiB")

    def rate() -> float:  # rounds of 16 malloc/free pairs per second, over 2 s
        before = int(target.ask("rounds", "rounds").split()[1])
        t0 = time.monotonic()
        time.sleep(2.0)
        after = int(target.ask("rounds", "rounds").split()[1])
        return (after - before) / (time.monotonic() - t0)

    try:
        wait_for(lambda: "String table:" in collector.text(), 20, "no push arrived")
        up = rate()
        collector.close()
        down = rate()  # pushes fail meanwhile
        collector = Collector(tmp_path, port)
        back = rate()
        wait_for(lambda: "String table:" in collector.text(), 30,
                 "no push arrived after the Collector came back")
        assert str(target.pid) in received(collector.text())["attrs"]["process.pid"]
        mh.stop()
    finally:
        collector.close()
    summary = mh.lines.expect("profiles sent to", 10)
    failed = int(re.search(r"(\d+) pushes failed", summary).group(1))
    assert failed >= 1, summary
    # Said while it happened, once each way.
    assert mh.stderr.count("memhook: push failed:") == 1, mh.stderr
    assert mh.stderr.count("arrive again") == 1, mh.stderr
    # The loop's pace with the Collector gone, against its pace with it there (generous: the
    # benchmark, benchmarks/otlp_push.py, measures the ratio; this catches a stalled target).
    assert down >= 0.5 * min(up, back), (up, down, back)


class Ingest(http.server.BaseHTTPRequestHandler):
    """Records each POST: path, query, content type and body."""
    got: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Ingest.got.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def form_fields(content_type: str, body: bytes) -> dict:
    boundary = content_type.split("boundary=")[1].encode()
    fields = {}
    for part in body.split(b"--" + boundary)[1:-1]:
        head, _, data = part.partition(b"\r\n\r\n")
        fields[re.search(rb'name="([^"]+)"', head).group(1).decode()] = data[:-2]
    return fields


@pytest.mark.skipif(shutil.which("go") is None, reason="Go is not installed")
def test_pprof_push_request(tmp_path, targets):
    """`--pprof-push URL`: what Pyroscope's /ingest is sent (README, "Fleet"): the query names
    the application with its labels and the time range, format=pprof; the form's `profile` is a
    gzip pprof that Go's pprof reads, with the leak's exact in-use bytes."""
    Ingest.got = []
    server = http.server.HTTPServer(("127.0.0.1", 0), Ingest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
        mh = Memhook(target.pid, tmp_path, "--pprof-push",
                     f"http://127.0.0.1:{server.server_port}", "--push-interval", "0.5",
                     "--label", "service=checkout", "--label", "env=prod")
        target.command("go")
        mh.stop()
    finally:
        server.shutdown()
    assert Ingest.got, "nothing was pushed"
    path, content_type, body = Ingest.got[-1]  # the push at detach
    url = urlparse(path)
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert url.path == "/ingest" and q["format"] == "pprof" and q["spyName"] == "memhook"
    assert q["name"] == f"checkout{{pid={target.pid},host={os.uname().nodename},env=prod}}", q
    assert int(q["from"]) <= int(q["until"]) <= time.time() + 1
    fields = form_fields(content_type, body)
    assert json.loads(fields["sample_type_config"])["inuse_space"]["aggregation"] == "average"
    heap = tmp_path / "pushed.pb.gz"
    heap.write_bytes(fields["profile"])
    assert gzip.decompress(heap.read_bytes())
    env = dict(os.environ, HOME=str(tmp_path), PPROF_TMPDIR=str(tmp_path), GOCACHE=go_cache())
    top = subprocess.run(["go", "tool", "pprof", "-top", "-sample_index=inuse_space", str(heap)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert top.returncode == 0, top.stderr
    line = next(line for line in top.stdout.splitlines() if line.endswith(" late_leak"))
    assert line.split()[0] == f"{LATE_LEAK}B", line


def test_workers_forked_by_a_traced_master(tmp_path, targets):
    """`--pid-of` on a pre-forking server: a worker forked before the run and one forked by the
    master while it is traced (inheriting its patched slots and its segment) are each traced as
    their own process, exactly; the master's session sees none of the workers' allocations."""
    name = f"prefork{os.getpid()}"
    master = targets(build(tmp_path, "prefork.c", name=name))
    workers = [int(master.ask("spawn", "worker").split()[1])]
    cap = tmp_path / "prefork.mh"
    mh = subprocess.Popen(memhook_cmd("--pid-of", name, "-o", cap, "--no-live"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        lines = Lines(mh.stdout)
        seen = {int(re.search(r"PID (\d+)", lines.expect("attached", 120)).group(1))
                for _ in range(2)}
        assert seen == {master.pid, workers[0]}
        workers.append(int(master.ask("spawn", "worker").split()[1]))  # forked while traced
        assert f"PID {workers[1]} " in lines.expect("attached", 120)
        for n, pid in enumerate(workers, 1):
            for i in range(1, n + 1):
                os.kill(pid, signal.SIGUSR1)
                master.expect(f"leaked {pid} {i}")
        master.command("leak")
        mh.send_signal(signal.SIGINT)
        assert mh.wait(60) == 0, mh.stderr.read()
        for pid in workers:
            os.kill(pid, 0)  # still running
    finally:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    alone = report_json(cap, "--pid", master.pid)
    assert site(alone, "master_leak")["outstanding_bytes"] == 5 * 111
    assert not any(s["frames"][0]["function"] == "worker_leak" for s in alone["sites"])
    for n, pid in enumerate(workers, 1):
        alone = report_json(cap, "--pid", pid)
        assert site(alone, "worker_leak")["outstanding_bytes"] == n * 4321, alone["totals"]
    merged = report_json(cap)
    assert site(merged, "worker_leak")["outstanding_bytes"] == 3 * 4321


def test_one_process_refusing_does_not_stop_the_others(tmp_path, targets):
    """`-p A,B` where B does not exist: A is traced and reported, B is one line, exit 1 (a
    process the user named could not be traced); nothing traceable at all, or no process of
    that name: one line, exit 1; a PID given twice: a usage error."""
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    out = run_memhook("-p", f"{target.pid},999999", "--duration", "1", "--no-live")
    assert out.returncode == 1, out.stderr
    assert f"attached to PID {target.pid}" in out.stdout and "detached from PID" in out.stdout
    assert "not tracing PID 999999: no process with PID 999999" in out.stderr
    assert f"memhook report: PID {target.pid}" in out.stdout and "Traceback" not in out.stderr
    gone = run_memhook("-p", "999998,999999", "--duration", "1")
    assert gone.returncode == 1 and gone.stderr.splitlines()[-1] == \
        "memhook: no process could be traced", gone.stderr
    none = run_memhook("--pid-of", f"nothing{os.getpid()}", "--duration", "1")
    assert none.returncode == 1 and "was traced" in none.stderr.splitlines()[-1], none.stderr
    twice = run_memhook("-p", f"{target.pid},{target.pid}")
    assert twice.returncode == 2 and twice.stderr.count("\n") == 1, twice.stderr
    assert target.finish() == 0


def test_one_exits_one_execs_the_third_goes_on(tmp_path, targets):
    """`-p A,B,C`: A exits and B execs another program mid-run; each one's session ends alone
    (its bytes kept), C is traced on to the end, and the run ends when every process has
    ended."""
    exe = build(tmp_path, "lifecycle.c")
    a, b, c = (targets(exe, "/nonexistent.so") for _ in range(3))
    cap = tmp_path / "three.mh"
    mh = subprocess.Popen(memhook_cmd("-p", f"{a.pid},{b.pid},{c.pid}", "-o", cap, "--no-live",
                                      "--interval", "0.2"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    lines = Lines(mh.stdout)
    for _ in range(3):
        lines.expect("attached", 120)
    for t in (a, b, c):
        t.command("go")
    assert a.finish() == 0
    assert f"detached from PID {a.pid} (target exited)" in lines.expect(f"PID {a.pid}", 30)
    b.proc.stdin.write("exec\n")
    b.proc.stdin.flush()
    assert "exec" in lines.expect(f"detached from PID {b.pid}", 30)
    c.command("go")  # still traced
    c.proc.stdin.write("exit\n")
    c.proc.stdin.flush()
    assert f"PID {c.pid}" in lines.expect("detached from", 30)
    assert mh.wait(60) == 0, mh.stderr.read()  # every process ended: the run ends by itself
    b.kill()
    rep = report_json(cap)
    got = {p["pid"]: (p["outstanding_bytes"], p["end_reason"]) for p in rep["processes"]}
    assert got == {a.pid: (LATE_LEAK, "target exited"),
                   b.pid: (LATE_LEAK, "target exec'd another program"),
                   c.pid: (2 * LATE_LEAK, "target exited")}, got
