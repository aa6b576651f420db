"""The target's files, kept by build-id where this host cannot find them by their path.

A process in a container (another mount namespace) maps /usr/lib/x86_64-linux-gnu/libc.so.6 of
its own root: /proc/PID/maps names the container's path, and on the host that path is another
file or none. While the target runs, memhook reads the file through /proc/PID/map_files (the
mapped file itself, whatever namespace it lives in) and keeps a copy under its build-id, as perf
keeps ~/.debug: `<store>/ab/cdef...`. Reports, live or offline, find the file there by the
build-id the capture records. A file the host sees at the same path (the host's own processes, a
chroot, whose paths /proc shows from the host's root) is not copied.

The store belongs to the user memhook runs as, under that user's home from the password database
(not $HOME, which sudo may leave pointing at the invoking user's directory): every directory is
created 0700 and checked to be ours and no symlink; files are written under a temporary name
(O_EXCL) and renamed into place.
"""
from __future__ import annotations

import os
import pwd
import shutil
import stat

ENV = "MEMHOOK_MODULE_STORE"  # another place (tests; a shared cache an operator chose)


def store_dir() -> str:
    return os.environ.get(ENV) or os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache",
                                               "memhook", "build-id")


def stored_path(build_id: str, store: str | None = None) -> str:
    return os.path.join(store or store_dir(), build_id[:2], build_id[2:])


def _own_dir(path: str) -> None:
    """`path` exists, is a directory (not a symlink to one) of ours, writable by nobody else."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(f"{path} is not a directory only memhook's user can write")


def _seen_by_host(module) -> bool:
    """Whether the path the target's maps name is, on this host, the very file mapped."""
    try:
        here = os.stat(module.path)
        there = os.stat(module.file)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _store() -> str:
    """The store's directory, made (each directory up to it ours, 0700) if it is not yet."""
    store = store_dir()
    parts = []
    head = store
    while not os.path.isdir(head):
        parts.append(head)
        head = os.path.dirname(head)
    for d in reversed(parts):
        _own_dir(d)
    _own_dir(store)
    return store


def _write(target: str, copy) -> None:
    """`copy(file)` writes the file kept at `target`: under a temporary name, then renamed."""
    _own_dir(os.path.dirname(target))
    tmp = f"{target}.{os.urandom(8).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as dst:
            copy(dst)
        os.rename(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def keep_image(build_id: str, data: bytes) -> str:
    """An object that is no file (the kernel's vDSO, read from the target's memory) kept under
    its build-id; its path there. OSError if it cannot be kept."""
    target = stored_path(build_id, _store())
    if not os.path.exists(target):
        _write(target, lambda dst: dst.write(data))
    return target


def keep(modules, kept: set) -> None:
    """Copies into the store each module of `modules` whose file the host cannot find by its
    path; `kept` holds the build-ids already handled (updated). A file that cannot be kept (a
    full disk, a store that is not ours) is left out: reports then name it not symbolized."""
    store = None
    for m in modules:
        if not m.build_id or m.build_id in kept or not m.file:
            continue
        kept.add(m.build_id)
        if _seen_by_host(m):
            continue
        try:
            store = store or _store()
            target = stored_path(m.build_id, store)
            if os.path.exists(target):
                continue

            def copy(dst, path=m.file):
                with open(path, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
            _write(target, copy)
        except OSError:
            continue
