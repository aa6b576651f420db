"""A JIT runtime's perf map: /tmp/perf-PID.map, the file Node.js (--perf-basic-prof), the JVM
(`jcmd PID Compiler.perfmap`, -XX:+DumpPerfMapAtExit), CPython 3.12+ (-X perf), .NET and LuaJIT
write for perf: one line per piece of compiled code, `START SIZE NAME` (hex, hex, the rest).
Read from the target's own root (the PID its namespace gives it), as the session goes, since it
grows and vanishes with the process, and kept in the capture (PMAP blocks), so that its frames
are named offline (symbolize/jit_frames.py).

The file belongs to the target's user, in a directory anyone writes: opened through the
target's root without following a symbolic link, read only, at most MAX_BYTES."""
from __future__ import annotations

import bisect
import os
import stat
from dataclasses import dataclass, field

from ..common import procfs

MAX_BYTES = 256 << 20  # a map beyond this is read no further (and the report says so)
HEAD = 256  # bytes of the map's start that tell it was written again
SCAN = 64  # entries before an address's looked at for one that covers it (JitMap)


@dataclass
class PerfMap:
    """What has been read of one process's perf map: its entries in file order (later ones
    win where ranges overlap, as perf reads them) and how far the file was read."""
    name: str = ""          # its path as the target sees it ("" until found)
    entries: list = field(default_factory=list)  # [start, size, name]
    offset: int = 0
    cut: bool = False       # MAX_BYTES reached
    head: bytes = b""       # its first HEAD bytes as first read
    rewritten: bool = False  # read again whole since the recorder last wrote it


def path_in_target(pid: int) -> str:
    """The map's path as the target names it: by its PID in its own namespace."""
    try:
        nspid = procfs.status(pid).get("NSpid", "").split()
    except OSError:
        nspid = []
    return f"/tmp/perf-{nspid[-1] if nspid else pid}.map"


def read_new(pid: int, into: PerfMap) -> list:
    """The entries added to the target's perf map since the last call (also kept in `into`);
    [] when it has none."""
    path = path_in_target(pid)
    from ..inject.target_files import open_dir_in_root  # (a live session's: reports need not)
    try:
        d = open_dir_in_root(pid, "tmp")
    except OSError:
        return []
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC |
                     os.O_NONBLOCK, dir_fd=d)
    except OSError:
        return []
    finally:
        os.close(d)
    try:
        st = os.fstat(fd)
        # A map last written before the process started is another's, of a PID since reused.
        if not stat.S_ISREG(st.st_mode) or st.st_mtime < procfs.started_at(pid) - 1:
            return []
        # Written again from its start (HotSpot's jcmd Compiler.perfmap writes the whole map
        # each time): read again whole.
        head = os.pread(fd, HEAD, 0)
        if st.st_size < into.offset or head[:len(into.head)] != into.head[:len(head)]:
            into.offset, into.entries, into.head = 0, [], b""
            into.rewritten = True
        into.head = into.head or head
        into.name = path
        room = MAX_BYTES - into.offset
        data = os.pread(fd, max(room, 0), into.offset) if room > 0 else b""
    except OSError:  # (the process gone meanwhile)
        return []
    finally:
        os.close(fd)
    end = data.rfind(b"\n") + 1  # whole lines only: the runtime may be writing the last
    if room <= len(data) and end < len(data):
        into.cut = True
    new = parse(data[:end])
    into.offset += end
    into.entries += new
    return new


def parse(data: bytes) -> list:
    out = []
    for line in data.decode(errors="replace").splitlines():
        parts = line.split(None, 2)
        if len(parts) < 2:
            continue
        try:
            start, size = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            continue
        out.append([start, size, parts[2].strip() if len(parts) > 2 else ""])
    return out


def to_json(entries: list, name: str = "", cut: bool = False, whole: bool = False) -> dict:
    """A PMAP block's value: entries the map gained (`whole`: all it has, replacing those
    before)."""
    return {"entries": entries, "path": name, "cut": cut, "whole": whole}


def from_json(value, into: PerfMap) -> None:
    try:
        if not isinstance(value, dict):
            raise ValueError
        for start, size, name in value["entries"]:
            if not (isinstance(start, int) and isinstance(size, int) and isinstance(name, str)
                    and 0 <= start < 1 << 64 and 0 <= size < 1 << 32):
                raise ValueError
            into.entries.append([start, size, name])
        into.name = str(value.get("path") or into.name)
        into.cut = bool(value.get("cut")) or into.cut
    except (KeyError, TypeError, ValueError):
        raise ValueError("perf map block malformed") from None


class JitMap:
    """A perf map's entries ([start, size, name] in file order), looked up by address."""

    def __init__(self, entries: list):
        self.entries = entries
        self.order = sorted(range(len(entries)), key=lambda i: entries[i][0])
        self.starts = [entries[i][0] for i in self.order]

    def __len__(self) -> int:
        return len(self.entries)

    def at(self, address: int):
        """The entry covering `address` ([start, size, name]), the latest where several do."""
        best = -1
        i = bisect.bisect_right(self.starts, address) - 1
        for j in range(i, max(i - SCAN, -1), -1):
            k = self.order[j]
            start, size, _ = self.entries[k]
            if start <= address < start + size and k > best:
                best = k
        return self.entries[best] if best >= 0 else None
