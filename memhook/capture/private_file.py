"""Files memhook writes for the operator: captures (-o), reports (--report-file, report -o) and
plots. They hold the target's command line, its environment's traces and its load addresses (its
ASLR layout), and memhook writes them as root, often into a shared directory, so:
- a new file is created owner-only (0600; the umask may narrow it, never widen it);
- a symbolic link, on the way or at the file itself, is followed only where nobody but memhook's
  user could have put it there: the link is that user's, in a directory of that user's that no
  one else may write (/dev/stdout, /var/run). This holds where fs.protected_symlinks is 0, and
  also in a directory another user owns, where the kernel's rule would follow their links;
- an existing file is reused only if it is a regular file of memhook's user with one link, or a
  character device (/dev/null: only root makes those), or a FIFO of memhook's user or reached
  through such a link (/dev/stdout into a pipe); a file
  another user planted, or a hard link to someone's file, is refused and left untouched.
"""
from __future__ import annotations

import errno
import os
import stat

from .format import CaptureError

MODE = 0o600
_HOPS = 40  # symbolic links followed on one path at most, as the kernel's ELOOP limit


class UnsafeOutput(CaptureError):
    pass


def _safe_link(dir_fd: int, name: str) -> bool:
    """Whether nobody but memhook's user could have made, or could change, this link."""
    link = os.lstat(name, dir_fd=dir_fd)
    d = os.fstat(dir_fd)
    me = os.geteuid()
    return link.st_uid == me and d.st_uid == me and not d.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _open_parent(path: str) -> tuple[int, str]:
    """An O_PATH fd for the directory that holds `path`, and the file's name in it."""
    parts = os.path.abspath(path).split("/")[1:]
    name = parts.pop()
    if not name or name in (".", ".."):
        raise UnsafeOutput(f"{path}: not a file name")
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    hops = 0
    try:
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            try:
                nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR) or \
                        not stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise OSError(e.errno, e.strerror, path) from None
                hops += 1
                if hops > _HOPS or not _safe_link(fd, part):
                    raise UnsafeOutput(f"refusing to write {path}: {part} is a symbolic link "
                                       "that another user could have planted") from None
                target = os.readlink(part, dir_fd=fd)
                parts[:0] = [p for p in target.split("/")]
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                continue
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def create(path: str, mode: int = MODE):
    """A binary file object to write `path` from its start, as the module's docstring says."""
    dir_fd, name = _open_parent(path)
    flags = os.O_WRONLY | os.O_CLOEXEC
    try:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
        except FileExistsError:
            follow = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
            if follow and not _safe_link(dir_fd, name):
                raise UnsafeOutput(f"refusing to write {path}: it is a symbolic link that "
                                   "another user could have planted") from None
            try:
                fd = os.open(name, flags | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)
            except OSError as e:
                raise OSError(e.errno, e.strerror, path) from None
            st = os.fstat(fd)
            ours = st.st_uid == os.geteuid()
            ok = (stat.S_ISCHR(st.st_mode) or (stat.S_ISFIFO(st.st_mode) and (ours or follow)) or
                  (stat.S_ISREG(st.st_mode) and ours and st.st_nlink == 1))
            if not ok:
                os.close(fd)
                why = (f"it belongs to uid {st.st_uid}" if not ours else
                       "it has other hard links" if stat.S_ISREG(st.st_mode) else
                       "not a regular file")
                raise UnsafeOutput(f"refusing to write {path}: {why}")
            if stat.S_ISREG(st.st_mode):
                os.ftruncate(fd, 0)
    finally:
        os.close(dir_fd)
    return os.fdopen(fd, "wb")


def write_all(f, data: bytes) -> None:
    """Write all of `data`: a buffered file's write() of more than 2 GiB writes 2 GiB - 4 KiB
    (one write(2); a 90,000-stack JSON report was cut there) and says so only in its result."""
    view = memoryview(data)
    while view:
        view = view[f.write(view):]
