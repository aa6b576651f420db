"""memhook's caches on disk, keyed by build-id: unwind rows (unwind/tables.py) and symbol tables
(symbolize/symbol_cache.py). Each lives in ~/.cache/memhook/KIND (or $XDG_CACHE_HOME's), made
owner-only; a directory that exists but is not memhook's user's alone is not used, and a file in
it is read only if it is a regular file of that user's (memhook runs as root: nobody else may
plant what it reads back). A file is written whole under a temporary name, then renamed; a
directory over its bound loses its least recently used files."""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile


def file_signature(path: str) -> list | None:
    """A file as it is now (inode, size, modification time), to tell whether what was cached
    from it still holds; None if it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def cache_dir(kind: str) -> str | None:
    """The directory of one kind of cache, created owner-only; None when it cannot be, or when
    it exists but is not ours alone (then nothing is cached)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "memhook", kind)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return path


def read(directory: str, key: str) -> bytes | None:
    """A cached file's bytes, or None (absent, or not a regular file of ours). Reading marks it
    recently used."""
    try:
        fd = os.open(os.path.join(directory, key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        with contextlib.suppress(OSError):
            os.utime(f.fileno())
        return f.read()


def write(directory: str, key: str, data: bytes, bound: int | None = None) -> None:
    """Store `data` as `key`; then, with `bound` (bytes), the least recently used files go until
    the directory holds at most that much. Failures leave the cache as it was."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(directory, key))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return
    if bound is not None:
        _evict(directory, bound)


def _evict(directory: str, bound: int) -> None:
    files = []
    with contextlib.suppress(OSError), os.scandir(directory) as it:
        for e in it:
            with contextlib.suppress(OSError):
                st = e.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and not e.name.startswith(".tmp-"):
                    files.append((st.st_mtime, st.st_size, e.path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= bound:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            total -= size
