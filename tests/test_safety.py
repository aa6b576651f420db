"""The target survives memhook: killed, forked, exec'd, attached twice."""
import signal
import subprocess
import time

from conftest import Memhook, build, memhook_cmd, site
from test_entry_points import assert_restored, slot_values


def test_memhook_killed_target_unhooks_itself(tmp_path, targets):
    exe = build(tmp_path, "lifecycle.c")
    target = targets(exe, "/nonexistent.so")
    _, before = slot_values(target.pid, exe)
    mh = subprocess.Popen(memhook_cmd("-p", target.pid, "--no-live", "--unhook-after", "1"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    assert "attached" in mh.stdout.readline()
    target.command("go")
    mh.send_signal(signal.SIGKILL)
    mh.wait()
    time.sleep(1.5)
    _, during = slot_values(target.pid, exe)
    assert during != before  # nobody restored anything yet: the target has not noticed
    target.command("churn")  # allocation traffic: a hook notices the silence and unhooks
    assert_restored(target.pid, exe, before)
    target.command("churn")
    again = Memhook(target.pid, tmp_path)  # and it can be attached again, exactly
    target.command("go")
    report = again.stop()
    assert report["totals"]["unknown_free_count"] == 0
    assert site(report, "late_leak")["outstanding_bytes"] == 7 * 99
    assert_restored(target.pid, exe, before)
    assert target.finish() == 0


def test_fork_child_runs_and_parent_stays_exact(tmp_path, targets):
    exe = build(tmp_path, "lifecycle.c")
    target = targets(exe, "/nonexistent.so")
    mh = Memhook(target.pid, tmp_path)
    for _ in range(3):
        assert target.ask("fork", "child") == "child 0"
    report = mh.stop()
    main_leaks = [s for s in report["sites"] if s["frames"][0]["function"] == "main"]
    assert sum(s["outstanding_bytes"] for s in main_leaks) == 3 * 5 * 111
    # Nothing the children did reached the parent's rings.
    assert report["totals"]["alloc_count"] == 3 * 5
    assert report["totals"]["unknown_free_count"] == 0
    assert target.finish() == 0


def test_target_execs_while_attached(tmp_path, targets):
    exe = build(tmp_path, "lifecycle.c")
    target = targets(exe, "/nonexistent.so")
    mh = Memhook(target.pid, tmp_path, "--interval", "0.2")
    target.command("go")
    target.proc.stdin.write("exec\n")
    target.proc.stdin.flush()
    report = mh.wait(timeout=30)  # memhook notices by itself and finishes
    assert "exec" in mh.lines.expect("detached", timeout=5)
    assert site(report, "late_leak")["outstanding_bytes"] == 7 * 99
    assert open(f"/proc/{target.pid}/cmdline").read().startswith("sleep")  # untouched
