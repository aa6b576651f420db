"""A target owned by another user: what memhook creates for it, and what it leaves behind."""
import os
import re
import shutil
import subprocess
import stat
from pathlib import Path

import pytest

from conftest import Memhook, run_memhook, site


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
    from memhook.common.procfs import TargetError, process_info
    from memhook.inject import target_files
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


@pytest.fixture
def shared_dir():
    """A sticky, world-writable directory, as /tmp is, that user nobody can write into."""
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="memhook-test-shared-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d)


def as_nobody(*cmd):
    subprocess.run(cmd, check=True, user="nobody", group="nogroup", cwd="/")


def test_outputs_are_the_operators_alone(tmp_path, shared_dir):
    """Captures, reports and plots written as root into a shared directory are mode 0600, and
    a symbolic link or a file planted at the output path by another user is refused, its
    target untouched (issue 42: on this host fs.protected_symlinks may be 0)."""
    exe = ["/usr/bin/python3", "-c", "kept = [bytearray(1000) for _ in range(100)]"]
    cap, text = shared_dir / "cap.mh", shared_dir / "report.txt"
    r = run_memhook("run", "--no-live", "-o", cap, "--report-file", text, "--", *exe)
    assert r.returncode == 0, r.stderr
    html, plots = shared_dir / "report.html", shared_dir / "plots"
    assert run_memhook("report", cap, "--format", "html", "-o", html).returncode == 0
    r = run_memhook("report", cap, "--plots", plots)
    assert r.returncode == 0, r.stderr
    written = [cap, text, html, *plots.iterdir()]
    assert len(written) > 3
    for path in written:
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path
        assert os.lstat(path).st_uid == 0
    assert stat.S_IMODE(os.stat(plots).st_mode) == 0o700
    # Writing again over memhook's own file is fine, and so are /dev/null and /dev/stdout (a
    # device, and a link of root's in a directory of root's to a pipe).
    assert run_memhook("report", cap, "--format", "html", "-o", html).returncode == 0
    assert run_memhook("report", cap, "-o", "/dev/null").returncode == 0
    r = run_memhook("report", cap, "-o", "/dev/stdout")
    assert r.returncode == 0 and "memhook report:" in r.stdout, r.stderr

    victim = shared_dir / "victim"
    as_nobody("sh", "-c", f"echo mine > {victim}")
    as_nobody("ln", "-s", str(victim), str(shared_dir / "planted.mh"))
    as_nobody("ln", "-s", str(victim), str(shared_dir / "planted.txt"))
    as_nobody("sh", "-c", f"echo theirs > {shared_dir / 'file.html'}")
    attempts = [("run", "--no-live", "-o", shared_dir / "planted.mh", "--", *exe),
                ("run", "--no-live", "--report-file", shared_dir / "planted.txt", "--", *exe),
                ("report", cap, "-o", shared_dir / "planted.txt"),
                ("report", cap, "--format", "html", "-o", shared_dir / "file.html")]
    for args in attempts:
        r = run_memhook(*args)
        assert r.returncode != 0, args
        assert "refusing to write" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert victim.read_text() == "mine\n" and os.stat(victim).st_uid != 0
    assert (shared_dir / "file.html").read_text() == "theirs\n"
    # A directory on the way that another user's symbolic link stands for is not followed.
    elsewhere = shared_dir / "elsewhere"
    as_nobody("mkdir", str(elsewhere))
    as_nobody("ln", "-s", str(elsewhere), str(shared_dir / "dir-link"))
    r = run_memhook("report", cap, "-o", shared_dir / "dir-link" / "r.txt")
    assert r.returncode != 0 and "refusing to write" in r.stderr, r.stderr
    assert list(elsewhere.iterdir()) == []
    # Nor a link in a directory of another user's own (the kernel's rule would follow it).
    theirs = shared_dir / "theirs"
    as_nobody("mkdir", "-m", "755", str(theirs))
    as_nobody("ln", "-s", str(victim), str(theirs / "r.txt"))
    r = run_memhook("report", cap, "-o", theirs / "r.txt")
    assert r.returncode != 0 and "refusing to write" in r.stderr, r.stderr
    assert victim.read_text() == "mine\n"
