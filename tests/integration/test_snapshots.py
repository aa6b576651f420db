"""Snapshots (issue 34, point 4): on demand (SIGUSR1 to memhook, `memhook snapshot PID`), when
a condition first holds (--snapshot-when rss>, pressure), before the OOM killer; `memhook report
--snapshot N` and `--diff M` between two snapshots of one capture."""
from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from conftest import Memhook, Target, build, report_json, run_memhook, site


def snapshot_taken(mh: Memhook, number: int) -> str:
    return mh.lines.expect(f"memhook: snapshot {number} of PID")


@pytest.mark.arm64
def test_two_snapshots_on_demand_and_their_diff(tmp_path):
    """SIGUSR1 to memhook, then `memhook snapshot TARGET_PID`: two snapshots, each printed and
    in the capture; their diff is exactly what the target allocated between them, and each
    reports alone as the capture's state then."""
    target = Target(build(tmp_path, "snapshots.c"))
    mh = Memhook(target.pid, tmp_path)
    target.command("grow 100")
    mh.proc.send_signal(signal.SIGUSR1)
    line = snapshot_taken(mh, 1)
    check_line = mh.lines.expect("leak check at snapshot (every thread stopped ")
    assert re.search(r"\(asked \(SIGUSR1\)\): 97\.7 KiB outstanding in 100 blocks$",
                     line.strip()), line
    target.command("grow 37")
    asked = run_memhook("snapshot", target.pid)
    assert asked.returncode == 0 and f"asked memhook (PID {mh.proc.pid})" in asked.stdout, \
        asked.stdout + asked.stderr
    snapshot_taken(mh, 2)
    target.command("grow 5")
    rep = mh.stop()
    assert target.finish() == 0
    assert [(s["number"], s["outstanding_count"]) for s in rep["snapshots"]] == [(1, 100),
                                                                              (2, 137)]
    diff = json.loads(run_memhook("report", mh.capture, "--snapshot", "2", "--diff", "1",
                                  "--format", "json").stdout)
    assert diff["change_bytes"] == 37000
    assert [(r["change_bytes"], r["outstanding_count_change"], r["frames"][0]["function"])
            for r in diff["sites"]] == [(37000, 37, "grow")]
    first = report_json(mh.capture, "--snapshot", "1")
    assert site(first, "grow")["outstanding_bytes"] == 100000
    # Each snapshot takes the leak check too: grow drops its blocks' addresses.
    assert first["leak_check"]["when"] == "snapshot"
    assert site(first, "grow")["definitely_lost_bytes"] == 100000
    assert "definitely lost 100000 bytes in 100 blocks" in check_line, check_line
    assert first["totals"]["alloc_count"] >= 100 and first["end_reason"].startswith("snapshot 1")
    text = run_memhook("report", mh.capture, "--snapshot", "1").stdout
    assert "[at snapshot 1 (asked (SIGUSR1))]" in text.splitlines()[0]
    to_end = json.loads(run_memhook("report", mh.capture, "--diff", "2", "--format",
                                    "json").stdout)
    assert to_end["change_bytes"] == 5000
    bad = run_memhook("report", mh.capture, "--snapshot", "3")
    assert bad.returncode == 2 and "holds no snapshot 3 (snapshots: 1, 2)" in bad.stderr
    # The diff's text leads each stack with the leak's own frame; the HTML page lists both.
    text = run_memhook("report", mh.capture, "--snapshot", "2", "--diff", "1").stdout
    assert re.search(r"^#1 \+37000 bytes \(100000 -> 137000\), \+37 blocks: grow  \S+snapshots"
                     r"\.c:\d+$", text, re.M), text
    page = tmp_path / "snapshots.html"
    assert run_memhook("report", mh.capture, "--format", "html", "-o", page).returncode == 0
    rows = re.findall(r"<tr><td class='num' data-v='(\d)'>\d</td><td class='num' data-v="
                      r"'[\d.]+'>[\d.]+ s</td><td>([^<]+)</td><td class='num' data-v='(\d+)'>",
                      page.read_text())
    assert [(n, why, int(b)) for n, why, b in rows][0] == ("1", "asked (SIGUSR1)", 100000), rows
    assert [(n, int(b)) for n, _, b in rows] == [("1", 100000), ("2", 137000)], rows


def test_rss_condition_fires_once(tmp_path):
    """--snapshot-when rss>SIZE: one snapshot the first time the target's RSS passes SIZE, none
    as it goes on growing."""
    target = Target(build(tmp_path, "snapshots.c"))
    rss = int(Path(f"/proc/{target.pid}/statm").read_text().split()[1]) * os.sysconf(
        "SC_PAGE_SIZE")
    limit = rss + (8 << 20)
    mh = Memhook(target.pid, tmp_path, "--snapshot-when", f"rss>{limit}")
    target.command("balloon 4")
    time.sleep(0.5)
    target.command("balloon 16")  # past the limit: the snapshot
    snapshot_taken(mh, 1)
    target.command("balloon 8")   # further: no second one
    time.sleep(0.5)
    rep = mh.stop()
    assert target.finish() == 0
    assert len(rep["snapshots"]) == 1, rep["snapshots"]
    snap = rep["snapshots"][0]
    assert snap["reason"].startswith(f"rss>{limit}: PID {target.pid}: RSS ")
    assert snap["rss_bytes"] > limit


def test_a_snapshot_before_the_oom_killer(tmp_path):
    """A memory cgroup the test makes (64 MiB limit, a 24 MiB soft limit or memory.high): the
    target balloons into it and is OOM-killed; --snapshot-when pressure took a snapshot before
    the kill (less than it held when killed), the ballooning stack first, and the capture says
    the cgroup counted an OOM kill."""
    group = make_memory_cgroup(64 << 20, 24 << 20)
    try:
        target = Target(build(tmp_path, "snapshots.c"))
        (group / "cgroup.procs").write_text(str(target.pid))
        mh = Memhook(target.pid, tmp_path, "--snapshot-when", "pressure")
        target.proc.stdin.write("balloon 200\n")
        target.proc.stdin.flush()
        assert target.proc.wait(timeout=120) == -signal.SIGKILL
        rep = mh.wait()
    finally:
        remove_cgroup(group)
    snaps = rep["snapshots"]
    assert len(snaps) == 1 and snaps[0]["reason"].startswith("pressure: "), snaps
    first = report_json(mh.capture, "--snapshot", "1")
    assert first["sites"][0]["frames"][0]["function"] == "balloon"
    held = first["sites"][0]["outstanding_bytes"]
    assert 16 << 20 < held < site(rep, "balloon")["outstanding_bytes"] <= 64 << 20, held
    assert rep["end_reason"] == "target exited; its memory cgroup counted an OOM kill"


def make_memory_cgroup(limit: int, soft: int) -> Path:
    """A memory cgroup of its own: v2 (memory.max, memory.high) where the host has it, else v1
    (memory.limit_in_bytes, memory.soft_limit_in_bytes)."""
    name = f"memhook-test-{uuid.uuid4().hex[:8]}"
    v1 = Path("/sys/fs/cgroup/memory")
    if v1.is_dir():
        g = v1 / name
        g.mkdir()
        (g / "memory.limit_in_bytes").write_text(str(limit))
        (g / "memory.soft_limit_in_bytes").write_text(str(soft))
        return g
    g = Path("/sys/fs/cgroup") / name
    g.mkdir()
    (g / "memory.max").write_text(str(limit))
    (g / "memory.high").write_text(str(soft))
    if (g / "memory.swap.max").exists():
        (g / "memory.swap.max").write_text("0")
    return g


def remove_cgroup(g: Path) -> None:
    for _ in range(50):
        try:
            g.rmdir()
            return
        except OSError:
            time.sleep(0.1)
