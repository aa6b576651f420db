"""Files the target must open: the shared-memory segment and the copy of the hook library.

Both are created by root with O_EXCL under unguessable names, inside the target's own root
(/proc/PID/root, so containers work), walking every directory with O_NOFOLLOW so that a symlink
planted by the target's user cannot redirect the creation. The segment belongs to the target's
effective uid, mode 0600; the library copy belongs to root, mode 0444, in a root-owned 0711
directory: the target can read it, nobody but root can replace it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat

from .. import _native
from ..common import procfs
from ..common.procfs import ProcessInfo, TargetError, start_ticks

SEGMENT_DIR = "dev/shm"
# Where the segment goes when the target's /dev/shm is no tmpfs (a chroot that mounted none): a
# file system in memory, or the rings would be a file on disk that the kernel keeps writing back.
SEGMENT_FALLBACKS = ("run/shm", "tmp", "var/tmp")
LIBRARY_DIRS = ("tmp", "var/tmp", "dev/shm")


def open_dir_in_root(pid: int, relative: str) -> int:
    """An O_PATH fd for a directory inside the target's root; no component may be a symlink."""
    fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in relative.split("/"):
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _name(*parts) -> str:
    """memhook-<memhook's pid>-...-<128 random bits>: unguessable, and tells whose it is."""
    return "-".join(["memhook", str(os.getpid()), *map(str, parts), secrets.token_hex(16)])


STALE = re.compile(r"^memhook-(\d+)-(?:\d+-)?[0-9a-f]{32}$")


def segment_dir(pid: int) -> tuple[str, str]:
    """The directory of the target's root for its segment, and a note for the user when it is
    not in memory: /dev/shm if a tmpfs, else the first tmpfs of SEGMENT_FALLBACKS."""
    kind = procfs.fs_type(pid, "/" + SEGMENT_DIR)
    if kind == "tmpfs":
        return SEGMENT_DIR, ""
    for where in SEGMENT_FALLBACKS:
        if procfs.fs_type(pid, "/" + where) == "tmpfs" and os.path.isdir(
                f"/proc/{pid}/root/{where}"):
            return where, ""
    kind = kind or "the root's own file system"
    return SEGMENT_DIR, (f"the target's /{SEGMENT_DIR} is not a tmpfs ({kind}), nor is any of "
                         + ", ".join("/" + d for d in SEGMENT_FALLBACKS)
                         + ": its rings are a file on disk, which the kernel writes back and "
                         "which lengthens a second attach's pause; mount a tmpfs on "
                         f"/{SEGMENT_DIR} in its root to avoid it")


def remove_stale(pid: int) -> None:
    """Files a memhook killed in mid-attach left in the target's /dev/shm and /tmp (their
    creator is gone); only root's library directories and the target's own segments."""
    dirs = [(d, False) for d in (SEGMENT_DIR, *SEGMENT_FALLBACKS)]
    dirs += [(d, True) for d in LIBRARY_DIRS]
    for where, is_dir in dirs:
        try:
            d = open_dir_in_root(pid, where)
        except OSError:
            continue
        try:
            for name in os.listdir(f"/proc/self/fd/{d}"):
                m = STALE.match(name)
                if not m or os.path.exists(f"/proc/{m.group(1)}"):
                    continue
                try:
                    st = os.stat(name, dir_fd=d, follow_symlinks=False)
                except FileNotFoundError:
                    continue    # another memhook's sweep removed it since the listing
                if is_dir and stat.S_ISDIR(st.st_mode) and st.st_uid == 0:
                    with contextlib.suppress(OSError):
                        sub = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=d)
                        remove_in(sub, HOOK_FILE)
                        os.rmdir(name, dir_fd=d)
                elif not is_dir and stat.S_ISREG(st.st_mode):
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=d)
        finally:
            os.close(d)


def remove_in(dir_fd: int, name: str, remove=os.unlink) -> None:
    """Remove `name` (if still there) inside the directory `dir_fd`, then close `dir_fd`."""
    with contextlib.suppress(FileNotFoundError):
        remove(name, dir_fd=dir_fd)
    os.close(dir_fd)


class Segment:
    """The shared segment: created and formatted here, opened by the hook library in the target."""

    def __init__(self, info: ProcessInfo, *, nrings: int, ring_bytes: int, depth: int,
                 clock: int, min_size: int, max_size: int, real: dict, known: list,
                 abandon_after_s: float = 5.0, sample_rate: int = 0, no_avx512: bool = False,
                 unwind_bytes: int = 0, slots: list = (), entries: list = (),
                 entry_area: tuple = (0, 0), max_wait_ns: int = 0, lossless: bool = False,
                 python_bytes: int = 0):
        self.name = _name(info.pid)
        where, self.note = segment_dir(info.pid)
        self.target_path = f"/{where}/{self.name}"
        try:
            self._dir = open_dir_in_root(info.pid, where)
        except OSError as e:
            raise TargetError(f"cannot use /{where} of the target: {e.strerror}") from None
        fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=self._dir)
        try:
            os.fchown(fd, info.uid, info.gid)
            _native.format_segment(fd, nrings, ring_bytes, depth, clock, min_size, max_size,
                                   info.pid, real, known, abandon_after_s, sample_rate, no_avx512,
                                   unwind_bytes, os.getpid(), start_ticks(os.getpid()),
                                   list(slots), entry_area[0], entry_area[1], list(entries),
                                   max_wait_ns, lossless, python_bytes)
            self.consumer = _native.Consumer(fd)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)

    def unlink(self) -> None:
        """Remove the name; the target's and the consumer's mappings live on."""
        if self._dir is not None:
            remove_in(self._dir, self.name)
            self._dir = None


HOOK_FILE = "libmemhook_hook.so"


class LibraryCopy:
    """The hook library, copied where the target can map it: the first of `dirs` (paths as the
    target sees its filesystem: its root, its mount namespace) that is not mounted noexec and
    takes the file. Which one was used is `target_path`."""

    def __init__(self, info: ProcessInfo, source: str, dirs=LIBRARY_DIRS):
        self.file = os.path.basename(source)
        self._parent = self._dir = None
        errors = []
        for where in dirs:
            where = where.strip("/")
            try:
                self._create(info.pid, where, source)
            except OSError as e:
                errors.append(f"/{where}: {e.strerror}")
                self.remove()
                continue
            self.target_path = f"/{where}/{self._dirname}/{self.file}"
            return
        raise TargetError("no directory the target can map the hook library from ("
                          + "; ".join(errors) + "): name one with --library-dir DIR")

    def _create(self, pid: int, where: str, source: str) -> None:
        parent = open_dir_in_root(pid, where)
        # Checked here, not found out inside the target: a dlopen that fails to map a segment
        # leaves the rest of the library mapped there.
        if os.fstatvfs(parent).f_flag & os.ST_NOEXEC:
            os.close(parent)
            raise OSError(errno.EACCES, "mounted noexec")
        self._parent = parent
        self._dirname = _name()
        os.mkdir(self._dirname, 0o700, dir_fd=self._parent)
        self._dir = os.open(self._dirname, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW,
                            dir_fd=self._parent)
        out = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=self._dir)
        with open(source, "rb") as src, os.fdopen(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
            os.fchmod(dst.fileno(), 0o444)
        os.chmod(self._dirname, 0o711, dir_fd=self._parent)

    def remove(self) -> None:
        """Once loaded, the file is no longer needed: the mapping keeps it alive."""
        if self._dir is not None:
            remove_in(self._dir, self.file)
            self._dir = None
        if self._parent is not None:
            remove_in(self._parent, self._dirname, os.rmdir)
            self._parent = None
