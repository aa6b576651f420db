"""Writing a capture: block by block while a session runs (Recorder), several processes into
one file (SharedWriter, a PROC block before each process's blocks), or a whole capture at once."""
from __future__ import annotations

import io
import json
import zlib

import numpy as np

from . import perf_map, private_file, python_code, snapshots
from .format import BLOCK, HEADER, MAGIC, VERSION, Capture, sparse_hists


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


class Writer:
    def __init__(self, path: str):
        self._f = private_file.create(path)
        self._f.write(HEADER.pack(MAGIC, VERSION, 0))
        self.bytes = HEADER.size

    # A megabyte or more (a burst's stacks, a large final block) at zlib's fastest level: a
    # Python program's import wrote 272 MB of blocks, compressed in 1.97 s at level 6 and 0.57 s
    # at level 1 (9.2 MB and 12.3 MB), on memhook's main thread beside the program. Smaller
    # blocks, a long session's every few seconds, stay at level 6, as small as before.
    FAST_FROM = 1 << 20

    def block(self, kind: bytes, payload: bytes) -> None:
        data = zlib.compress(payload, 1 if len(payload) >= self.FAST_FROM else 6)
        private_file.write_all(self._f, BLOCK.pack(kind, zlib.crc32(data), len(data)) + data)
        self._f.flush()
        self.bytes += BLOCK.size + len(data)

    def json(self, kind: bytes, value) -> None:
        self.block(kind, json.dumps(value).encode())

    def arrays(self, kind: bytes, **arrays) -> None:
        self.block(kind, _npz(**arrays))

    def close(self) -> None:
        self.block(b"END ", b"")
        self._f.close()


class SharedWriter(Writer):
    """One capture file for several processes: each process's blocks follow a PROC block naming
    it, written whenever the writing process changes (docs/capture-format.md)."""

    def __init__(self, path: str):
        super().__init__(path)
        self._current = 0

    def process(self, index: int) -> "ProcessWriter":
        return ProcessWriter(self, index)

    def block_of(self, index: int, kind: bytes, payload: bytes) -> None:
        if index != self._current:
            Writer.block(self, b"PROC", json.dumps({"index": index}).encode())
            self._current = index
        Writer.block(self, kind, payload)


class ProcessWriter(Writer):
    """A process's view of a SharedWriter; closing it leaves the file open for the others."""

    def __init__(self, shared: SharedWriter, index: int):  # noqa: super().__init__ opens a file
        self.shared, self.index = shared, index

    @property
    def bytes(self) -> int:
        return self.shared.bytes

    def block(self, kind: bytes, payload: bytes) -> None:
        self.shared.block_of(self.index, kind, payload)

    def close(self) -> None:
        pass


def write(path: str, cap: Capture) -> None:
    """A whole capture at once (reports and tests; live sessions use Recorder)."""
    w = Writer(path)
    w.json(b"META", cap.meta)
    w.json(b"MODS", cap.modules)
    w.arrays(b"STKS", first=np.array(0, np.uint64), offsets=cap.stack_offsets,
             frames=cap.stack_frames)
    w.arrays(b"AGGR", **cap.sites)
    if cap.python_code:
        w.json(b"PYCO", python_code.to_json(cap.python_code))
    if cap.jit_map.get("entries"):
        w.json(b"PMAP", perf_map.to_json(cap.jit_map["entries"], cap.jit_map.get("name", ""),
                                         cap.jit_map.get("cut", False)))
    for snap in cap.snapshots:
        w.arrays(b"SNAP", **snapshots.block({k: snap.get(k) for k in snapshots.FIELDS},
                                             snap["sites"], ids=snap["sites"]["id"]))
    if cap.series:
        w.arrays(b"TSER", **cap.series)
    if cap.events is not None:
        w.arrays(b"EVTS", **{n: cap.events[n] for n in cap.events.dtype.names})
    if cap.behaviour is not None:
        w.arrays(b"BEHV", **sparse_hists(cap.behaviour))
    if cap.live is not None:
        w.arrays(b"LIVE", **cap.live)
    w.close()
