"""Files memhook writes for the operator: captures (-o), reports (--report-file, report -o) and
plots. They hold the target's command line, its environment's traces and its load addresses (its
ASLR layout), and memhook writes them as root, often into a shared directory, so:
- a new file is created owner-only (0600; the umask may narrow it, never widen it);
- no symbolic link is followed where another user could have planted it: the file's own name
  never, a directory on the way only where the kernel's protected_symlinks rule would (the link
  is memhook's user's, or the directory is not sticky and world-writable, or the link belongs
  to the directory's owner), so that the rule holds even where fs.protected_symlinks is 0;
- an existing file is reused only if it is a regular file of memhook's user with one link (a
  file another user planted, or a hard link to someone's file, is refused, untouched).
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
    """Whether following the symbolic link `name` in that directory is safe for root."""
    link = os.lstat(name, dir_fd=dir_fd)
    d = os.fstat(dir_fd)
    shared = d.st_mode & stat.S_ISVTX and d.st_mode & stat.S_IWOTH
    return link.st_uid == os.geteuid() or not shared or link.st_uid == d.st_uid


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
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
        except FileExistsError:
            try:
                fd = os.open(name, flags, dir_fd=dir_fd)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise UnsafeOutput(f"refusing to write {path}: it is a symbolic link") \
                        from None
                raise OSError(e.errno, e.strerror, path) from None
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
                os.close(fd)
                why = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
                       f"it belongs to uid {st.st_uid}" if st.st_uid != os.geteuid() else
                       "it has other hard links")
                raise UnsafeOutput(f"refusing to write {path}: {why}")
            os.ftruncate(fd, 0)
    finally:
        os.close(dir_fd)
    return os.fdopen(fd, "wb")
