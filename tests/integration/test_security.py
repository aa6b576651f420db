"""A target owned by another user: what memhook creates for it, and what it leaves behind."""
import os
import re
import stat
from pathlib import Path

import pytest

from conftest import Memhook, site


def leftovers(target_pid: int, memhook_pid: int = 0) -> set:
    """memhook's files in /dev/shm and /tmp for this target or made by this memhook (a segment
    is memhook-MEMHOOK-TARGET-TOKEN, a library copy memhook-MEMHOOK-TOKEN/): other tests'
    memhooks may come and go meanwhile."""
    found = [f"/dev/shm/{n}" for n in os.listdir("/dev/shm") if n.startswith("memhook-")]
    found += [f"/tmp/{n}" for n in os.listdir("/tmp") if n.startswith("memhook-")]
    return {f for f in found if f"-{target_pid}-" in f
            or (memhook_pid and f.split("/")[-1].startswith(f"memhook-{memhook_pid}-"))}


def test_target_of_another_user(tmp_path, nobody_target):
    target = nobody_target
    assert os.stat(f"/proc/{target.pid}").st_uid != 0
    assert leftovers(target.pid) == set()
    mh = Memhook(target.pid, tmp_path)
    maps = open(f"/proc/{target.pid}/maps").read()
    # The segment: an unguessable name (128 random bits), already unlinked.
    assert re.search(rf"/dev/shm/memhook-\d+-{target.pid}-[0-9a-f]{{32}} \(deleted\)", maps)
    # The library copy: loaded from an unguessable directory, already deleted.
    assert re.search(r"/tmp/memhook-\d+-[0-9a-f]{32}/libmemhook_hook\.so \(deleted\)", maps)
    assert leftovers(target.pid, mh.proc.pid) == set()
    target.command("go")
    report = mh.stop()
    assert site(report, "late_leak")["outstanding_bytes"] == 7 * 99
    assert leftovers(target.pid, mh.proc.pid) == set()
    assert target.finish() == 0


def test_symlinked_shm_dir_is_not_followed(tmp_path, nobody_target, monkeypatch):
    """A directory on the way to the segment that is a symlink (as a container's user could
    plant in its own root) makes memhook refuse instead of creating files elsewhere."""
    from memhook.inject import target_files
    from memhook.procfs import TargetError, process_info
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (tmp_path / "shm-link").symlink_to(decoy)
    monkeypatch.setattr(target_files, "SEGMENT_DIR", str(tmp_path / "shm-link").lstrip("/"))
    monkeypatch.setattr(target_files, "SEGMENT_FALLBACKS", ())  # (a tmpfs /tmp would be one)
    info = process_info(nobody_target.pid)
    with pytest.raises(TargetError):
        target_files.Segment(info, nrings=1, ring_bytes=4096, depth=4, clock=0, min_size=0,
                        max_size=1, real={}, known=[])
    assert list(decoy.iterdir()) == []
    assert stat.S_ISLNK(os.lstat(tmp_path / "shm-link").st_mode)


def test_stale_files_of_a_killed_memhook_are_removed(tmp_path, nobody_target):
    dead = 4194000  # above any pid this machine has handed out
    while os.path.exists(f"/proc/{dead}"):
        dead += 1
    token = "0123456789abcdef" * 2
    seg = Path(f"/dev/shm/memhook-{dead}-{nobody_target.pid}-{token}")
    lib_dir = Path(f"/tmp/memhook-{dead}-{token}")
    alive = Path(f"/dev/shm/memhook-{os.getpid()}-1-{token}")  # its memhook still runs
    seg.write_bytes(b"x")
    lib_dir.mkdir()
    (lib_dir / "libmemhook_hook.so").write_bytes(b"x")
    alive.write_bytes(b"x")
    try:
        mh = Memhook(nobody_target.pid, tmp_path)
        mh.stop()
        assert not seg.exists() and not lib_dir.exists()
        assert alive.exists()
    finally:
        alive.unlink()
    assert nobody_target.finish() == 0
