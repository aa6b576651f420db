"""The sweep of files a killed memhook left behind, when two memhooks sweep at once."""
import os
import secrets

from memhook.inject import target_files


def dead_pid() -> int:
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


def test_a_stale_name_removed_by_another_sweep_is_passed_over(monkeypatch):
    """Between this sweep's listing and its stat, another memhook (attaching to another process
    at the same moment) removed the file: the attach goes on (it failed with ENOENT once)."""
    gone = f"memhook-{dead_pid()}-{secrets.token_hex(16)}"
    stale = f"memhook-{dead_pid()}-{secrets.token_hex(16)}"
    made = []
    for where in ("dev/shm", "tmp"):
        path = f"/{where}/{stale}"
        with open(path, "x"):
            made.append(path)
    real_listdir = os.listdir
    monkeypatch.setattr(target_files.os, "listdir",
                        lambda path: [gone, *real_listdir(path)])
    try:
        target_files.remove_stale(os.getpid())
        assert not any(os.path.exists(p) for p in made)   # the sweep went on past `gone`
    finally:
        for p in made:
            if os.path.exists(p):
                os.unlink(p)
