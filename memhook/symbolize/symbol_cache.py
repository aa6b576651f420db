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
import io
import json

import numpy as np

from ..common import disk_cache

VERSION = 2  # 2: signal spans of trampolines found by their code (unwind_tables v7)
BOUND = 256 << 20  # bytes on disk, the least recently used entries dropped first
MAX_LOCATED = 200_000  # placed addresses kept per module (an entry is read whole per report)


def _name(module: dict, lookup) -> str | None:
    bid = module.get("build_id") or ""
    if not bid or any(c not in "0123456789abcdef" for c in bid):
        return None
    where = json.dumps([module["path"], list(lookup.debug_dirs), lookup.sysroot]).encode()
    return f"{bid}-{hashlib.sha256(where).hexdigest()[:12]}.syms"


class Entry:
    """What an entry holds: the function table, signal spans, the DWARF file, placed addresses,
    and the files considered with their signatures."""

    def __init__(self, starts, ends, names: list, signal_spans: list, dwarf_path: str | None,
                 located: dict, considered: list):
        self.starts, self.ends, self.names = starts, ends, names
        self.signal_spans, self.dwarf_path = signal_spans, dwarf_path
        self.located, self.considered = located, considered


def load(module: dict, lookup) -> Entry | None:
    name, directory = _name(module, lookup), disk_cache.cache_dir("symbols")
    data = disk_cache.read(directory, name) if name and directory else None
    if data is None:
        return None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes())
            if meta.get("version") != VERSION or any(
                    disk_cache.file_signature(p) != sig for p, sig in meta["considered"]):
                return None
            names = z["names"].tobytes().decode().split("\0") if len(z["starts"]) else []
            # (frames as JSON gave them, [function, file, line] lists: read only by unpacking)
            located = {int(a): frames for a, frames in meta["located"]}
            return Entry(z["starts"].astype(np.uint64), z["ends"].astype(np.uint64), names,
                         [tuple(s) for s in meta["signal_spans"]], meta["dwarf_path"], located,
                         meta["considered"])
    except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError):
        return None  # (not an entry this version wrote: built again)


def store(module: dict, lookup, entry: Entry) -> None:
    name, directory = _name(module, lookup), disk_cache.cache_dir("symbols")
    if not name or not directory:
        return
    meta = {"version": VERSION, "considered": entry.considered,
            "signal_spans": [list(s) for s in entry.signal_spans],
            "dwarf_path": entry.dwarf_path,
            "located": [[a, [list(f) for f in frames]] for a, frames in
                        list(entry.located.items())[:MAX_LOCATED]]}
    out = io.BytesIO()
    np.savez(out, starts=entry.starts, ends=entry.ends,
             names=np.frombuffer("\0".join(entry.names).encode(), dtype=np.uint8),
             meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    disk_cache.write(directory, name, out.getvalue(), BOUND)
