"""Each module's symbols kept on disk by build-id (~/.cache/memhook/symbols, disk_cache.py):
its function table and every address already placed in its DWARF (function, file:line and
inlined frames), so that a second report of a capture, or the report of a session whose
symbols the session already looked up, opens neither the binary nor its debug file.

An entry holds for one build-id and one way of finding files (the module's path, the debug
directories and the sysroot are in its name). It is used only while every file that was considered in finding the
module's binary and debug file (Lookup.find) is as it was then: the same inode, size and time
if it was there, still absent if it was not, so that installing a debug package later is
noticed. Only the native symbolizer's results are kept (--symbolizer auto or libdw).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from ..common import disk_cache

VERSION = 3  # 3: one header and raw arrays, not an npz (0.7 ms less an entry to open)
BOUND = 256 << 20  # bytes on disk, the least recently used entries dropped first
MAX_LOCATED = 200_000  # placed addresses kept per module (an entry is read whole per report)
MAGIC = b"memhook symbols\n"
# An entry: MAGIC, the header's length (8 bytes, little-endian), the header (JSON: version,
# the function count, placed addresses, ...), then the functions' starts and ends (uint64
# each) and their names, each ended by a NUL. A report of 10,000 stacks over 100 modules opens
# 100 entries: as npz files (a zip of four arrays and JSON) they took 0.07 s to open and 0.02
# s to split their names, a tenth of its second.


def _name(module: dict, lookup) -> str | None:
    bid = module.get("build_id") or ""
    if not bid or any(c not in "0123456789abcdef" for c in bid):
        return None
    where = json.dumps([module["path"], list(lookup.debug_dirs), lookup.sysroot]).encode()
    return f"{bid}-{hashlib.sha256(where).hexdigest()[:12]}.syms"


class Names:
    """A function table's names read from an entry, each decoded when it is asked for: a
    report names a few hundred functions of each module's tens of thousands."""

    def __init__(self, blob: bytes):
        self.blob = blob
        ends = np.flatnonzero(np.frombuffer(blob, np.uint8) == 0)
        self._starts = np.concatenate(([0], ends[:-1] + 1)).tolist() if len(ends) else []
        self._ends = ends.tolist()

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> str:
        return self.blob[self._starts[i]:self._ends[i]].decode()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class Entry:
    """What an entry holds: the function table, signal spans, the DWARF file, placed addresses,
    and the files considered with their signatures."""

    def __init__(self, starts, ends, names, signal_spans: list, dwarf_path: str | None,
                 located: dict, considered: list):
        self.starts, self.ends, self.names = starts, ends, names
        self.signal_spans, self.dwarf_path = signal_spans, dwarf_path
        self.located, self.considered = located, considered


def load(module: dict, lookup) -> Entry | None:
    name, directory = _name(module, lookup), disk_cache.cache_dir("symbols")
    data = disk_cache.read(directory, name) if name and directory else None
    if data is None or not data.startswith(MAGIC):
        return None  # (absent, or not an entry this version wrote: built again)
    try:
        at = len(MAGIC) + 8
        size = int.from_bytes(data[len(MAGIC):at], "little")
        meta = json.loads(data[at:at + size])
        if meta.get("version") != VERSION or any(
                disk_cache.file_signature(p) != sig for p, sig in meta["considered"]):
            return None
        n, at = meta["functions"], at + size
        starts = np.frombuffer(data, np.uint64, n, at)
        ends = np.frombuffer(data, np.uint64, n, at + 8 * n)
        names = Names(data[at + 16 * n:])
        if len(names) != n:
            return None
        # (frames as JSON gave them, [function, file, line] lists: read only by unpacking)
        located = {int(a): frames for a, frames in meta["located"]}
        return Entry(starts, ends, names, [tuple(s) for s in meta["signal_spans"]],
                     meta["dwarf_path"], located, meta["considered"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def store(module: dict, lookup, entry: Entry) -> None:
    name, directory = _name(module, lookup), disk_cache.cache_dir("symbols")
    if not name or not directory:
        return
    meta = json.dumps({
        "version": VERSION, "functions": len(entry.starts), "considered": entry.considered,
        "signal_spans": [list(s) for s in entry.signal_spans], "dwarf_path": entry.dwarf_path,
        "located": [[a, [list(f) for f in frames]] for a, frames in
                    list(entry.located.items())[:MAX_LOCATED]]}).encode()
    meta += b" " * (-(len(MAGIC) + len(meta)) % 8)  # (the arrays aligned, for searchsorted)
    names = entry.names.blob if isinstance(entry.names, Names) else \
        b"".join(n.encode() + b"\0" for n in entry.names)
    disk_cache.write(directory, name, b"".join((
        MAGIC, len(meta).to_bytes(8, "little"), meta,
        np.asarray(entry.starts, np.uint64).tobytes(), np.asarray(entry.ends, np.uint64).tobytes(),
        names)), BOUND)
