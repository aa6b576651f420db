"""memhook's caches on disk (memhook/common/disk_cache.py): owner-only, never another user's file,
bounded by dropping the least recently used."""
import os
import time

import pytest

from memhook.common import disk_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return disk_cache.cache_dir("test")


def test_written_whole_and_owner_only(cache):
    assert os.stat(cache).st_mode & 0o777 == 0o700
    disk_cache.write(cache, "a", b"x" * 10)
    assert disk_cache.read(cache, "a") == b"x" * 10
    assert os.stat(os.path.join(cache, "a")).st_mode & 0o777 == 0o600
    assert disk_cache.read(cache, "missing") is None


def test_a_directory_others_may_write_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    os.makedirs(tmp_path / "memhook" / "open")
    os.chmod(tmp_path / "memhook" / "open", 0o777)
    assert disk_cache.cache_dir("open") is None


def test_links_and_other_users_files_are_not_read(cache, tmp_path):
    (tmp_path / "elsewhere").write_bytes(b"planted")
    os.symlink(tmp_path / "elsewhere", os.path.join(cache, "link"))
    assert disk_cache.read(cache, "link") is None
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    disk_cache.write(cache, "theirs", b"planted")
    os.chown(os.path.join(cache, "theirs"), 65534, 65534)
    assert disk_cache.read(cache, "theirs") is None


def test_bounded_least_recently_used_first(cache):
    for i, key in enumerate("abc"):
        disk_cache.write(cache, key, b"x" * 100)
        os.utime(os.path.join(cache, key), (time.time() - 100 + i, time.time() - 100 + i))
    disk_cache.read(cache, "a")  # a is now the most recently used
    disk_cache.write(cache, "d", b"x" * 100, bound=300)
    assert sorted(os.listdir(cache)) == ["a", "c", "d"]
