"""Stress, bounded in time: many attach/detach cycles on a busy self-checking target, memhook
killed at random moments, a fork/exec storm while attached."""
import random
import signal
import subprocess
import time

import pytest

from conftest import Memhook, assert_restored, build, memhook_cmd, site, slot_values
from memhook.common.procfs import read_maps


def corrupt_count(target) -> int:
    return int(target.ask("check", "check").split()[2])


def segment_mappings(pid: int) -> tuple[int, int]:
    """Address space the target maps from memhook segment files: (bytes, mappings)."""
    maps = [m for m in read_maps(pid) if "/memhook-" in m.path and "libmemhook" not in m.path]
    return sum(m.end - m.start for m in maps), len(maps)


@pytest.mark.xdist_group("heavy")  # every core busy: never beside another heavy test
def test_200_attach_detach_cycles(tmp_path, targets):
    from memhook.consumer.session import Options, Session
    exe = build(tmp_path, "stress.cpp", base_flags=["-g", "-O1", "-fno-omit-frame-pointer"])
    # Its eight threads keep both cores busy whenever memhook waits (on GDB, on the target):
    # nice 19 keeps them from starving memhook's own work, 2 s a cycle otherwise.
    target = targets(exe, nice=19)
    _, before = slot_values(target.pid, exe)
    rng = random.Random(7)
    for cycle in range(200):
        session = Session(target.pid, Options())
        session.attach()
        if cycle == 0:
            one_segment = segment_mappings(target.pid)
            assert one_segment[1] == 1
        else:  # each session's segment takes the previous one's place: no address space lost
            assert segment_mappings(target.pid) == one_segment, cycle
        time.sleep(rng.uniform(0, 0.03))
        session.detach("cycle")
        assert not session.detach_error and not session.not_restored, (cycle, session.abandoned)
        assert session.consumer.totals()["alloc_count"] > 0, (cycle, session.abandoned)
        if cycle % 50 == 0:
            assert corrupt_count(target) == 0
    assert_restored(target.pid, exe, before)
    mh = Memhook(target.pid, tmp_path)  # the last attach: exact
    target.command("leak")
    report = mh.stop()
    assert site(report, "main_leak")["outstanding_bytes"] == 10 * 777
    assert corrupt_count(target) == 0
    assert target.finish() == 0


@pytest.mark.xdist_group("heavy")  # every core busy: never beside another heavy test
def test_memhook_killed_at_random_moments(tmp_path, targets):
    """SIGKILL while memhook scans, injects, traces or detaches: the target survives, unhooks
    itself, and is attached again at the end with exact numbers."""
    exe = build(tmp_path, "stress.cpp", base_flags=["-g", "-O1", "-fno-omit-frame-pointer"])
    target = targets(exe, nice=19)  # (as test_200_attach_detach_cycles: not starved)
    _, before = slot_values(target.pid, exe)
    rng = random.Random(11)
    for cycle in range(25):
        mh = subprocess.Popen(memhook_cmd("-p", target.pid, "--no-live", "--unhook-after",
                                          "0.3"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, cwd="/")
        after = rng.uniform(0, 1.2)
        time.sleep(after)
        detaching = rng.random() < 0.4
        if detaching:
            mh.send_signal(signal.SIGINT)  # let it start detaching...
            time.sleep(rng.uniform(0, 0.1))
        mh.send_signal(signal.SIGKILL)  # ...then kill it wherever it is
        said = mh.communicate()[1]
        for _ in range(200):  # a GDB it started finishes on its own
            if "TracerPid:\t0" in open(f"/proc/{target.pid}/status").read():
                break
            time.sleep(0.05)
        # (what memhook had said when killed: where it was)
        assert target.proc.poll() is None, (cycle, after, detaching, said[-2000:])
    time.sleep(0.5)  # every abandoned session is stale; the busy threads notice and unhook
    assert corrupt_count(target) == 0
    assert_restored(target.pid, exe, before)
    mh = Memhook(target.pid, tmp_path)
    target.command("leak")
    assert site(mh.stop(), "main_leak")["outstanding_bytes"] == 10 * 777
    assert corrupt_count(target) == 0
    assert target.finish() == 0


@pytest.mark.xdist_group("heavy")  # every core busy: never beside another heavy test
def test_fork_exec_storm(tmp_path, targets):
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    mh = Memhook(target.pid, tmp_path)
    assert target.ask("storm", "storm") == "storm 0"  # every child exited 0
    target.command("go")
    report = mh.stop()
    storm = [s for s in report["sites"] if s["frames"][0]["function"] == "main"]
    assert sum(s["outstanding_bytes"] for s in storm) == 100 * 123
    assert site(report, "late_leak")["outstanding_bytes"] == 7 * 99
    assert report["totals"]["alloc_count"] == 100 + 7  # no child's allocation among them
    assert target.finish() == 0


@pytest.mark.xdist_group("heavy")  # every core busy: never beside another heavy test
def test_twenty_leak_checks_while_eight_threads_churn(tmp_path, targets):
    """Twenty snapshots, each with its leak check (every thread stopped, the heap scanned),
    while eight threads allocate, free and pass blocks on at full speed: the target's blocks
    stay intact, and the quiet blocks (main_leak's 10 x 777, addresses dropped) are definitely
    lost in every one of them."""
    from conftest import report_json
    exe = build(tmp_path, "stress.cpp", base_flags=["-g", "-O1", "-fno-omit-frame-pointer"])
    target = targets(exe, nice=19)
    mh = Memhook(target.pid, tmp_path, "--max-pause", "5000")  # (a loaded CI machine)
    target.command("leak")
    for n in range(1, 21):
        mh.proc.send_signal(signal.SIGUSR1)
        mh.lines.expect(f"memhook: snapshot {n} of PID")
        mh.lines.expect("leak check at snapshot (every thread stopped ")
    mh.stop()
    assert corrupt_count(target) == 0
    assert target.finish() == 0
    for n in range(1, 21):
        rep = report_json(mh.capture, "--snapshot", str(n))
        assert rep["leak_check"]["threads"] == 9, n
        leak = site(rep, "main_leak")
        assert (leak["definitely_lost_count"], leak["definitely_lost_bytes"]) == (10, 7770), n
