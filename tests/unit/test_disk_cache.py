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


def test_rows_of_an_object_without_a_build_id_are_cached_while_it_is_unchanged(tmp_path,
                                                                               monkeypatch):
    """An object linked without a build-id (numpy's bundled OpenBLAS: 0.8 s of rows) is cached
    by the file as it is: read back while it is unchanged, built again once it is replaced."""
    import subprocess
    from memhook.unwind import tables
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    src, lib = tmp_path / "lib.c", tmp_path / "libnobid.so"

    def build(body):
        src.write_text(body)
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,--build-id=none", "-o", str(lib),
                        str(src)], check=True)

    build("int f(int x) { return x * 3; }\nint g(int x) { return f(x) + 1; }\n")
    directory = tables.cache_dir()
    first = tables.rows_for(str(lib), "", directory)
    again = tables.rows_for(str(lib), "", directory)
    assert (first.from_cache, again.from_cache) == (False, True)
    assert again.rows == first.rows
    time.sleep(0.01)  # (a new modification time, even where its resolution is coarse)
    build("int f(int x) { return x * 3; }\nint g(int x) { return f(x) + 1; }\n"
          "int h(int x) { return g(x) * f(x) + 2; }\n")
    changed = tables.rows_for(str(lib), "", directory)
    assert not changed.from_cache and changed.rows != first.rows


def test_a_symbol_entry_reads_back_what_was_stored_and_grows(tmp_path, monkeypatch):
    """A module's symbols on disk (symbol_cache.py) read back as stored: every name (an empty
    one and non-ASCII ones too), the table, placed addresses; an entry read back and stored
    again with more placed addresses keeps its names; a file not in the format is no entry."""
    import numpy as np
    from memhook.symbolize import symbol_cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    class Lookup:
        debug_dirs, sysroot = (), None
    module, lookup = {"path": "/lib/libx.so", "build_id": "ab12"}, Lookup()
    names = ["main", "", "operator new(unsigned long)", "ψ_function", "last"]
    starts = np.array([16, 32, 48, 64, 80], np.uint64)
    symbol_cache.store(module, lookup, symbol_cache.Entry(
        starts, starts + 8, names, [(90, 94)], None, {40: [["f", "a.c", 3]]},
        [["/lib/libx.so", None]]))
    got = symbol_cache.load(module, lookup)
    assert list(got.names) == names and [got.names[i] for i in range(5)] == names
    assert got.starts.tolist() == starts.tolist() and got.ends.tolist() == (starts + 8).tolist()
    assert got.signal_spans == [(90, 94)] and got.located == {40: [["f", "a.c", 3]]}
    got.located[50] = [["g", None, None]]
    symbol_cache.store(module, lookup, got)
    again = symbol_cache.load(module, lookup)
    assert list(again.names) == names and sorted(again.located) == [40, 50]
    directory = disk_cache.cache_dir("symbols")
    path = os.path.join(directory, os.listdir(directory)[0])
    with open(path, "r+b") as f:  # (an older entry, an npz: built again, never misread)
        f.write(b"PK\x03\x04")
    assert symbol_cache.load(module, lookup) is None
