"""Reading a capture, every field validated: a damaged or hostile file is one line
(CaptureError), never a traceback; a capture cut off reads up to its last complete block."""
from __future__ import annotations

import io
import json
import zlib

import numpy as np

from . import python_code, snapshots
from .format import (BEHAVIOUR_HISTS, BEHAVIOUR_LATER_HISTS, BEHAVIOUR_PAIRS, BEHAVIOUR_ROWS,
                     BLOCK, EVENT_DTYPE, HEADER, LIVE_COLUMNS, MAGIC, MAX_BLOCK, MAX_PROCESSES,
                     PEAK_COLUMNS, SITE_COLUMNS, UNCERTAIN_COLUMNS, VERSION, Capture,
                     CaptureError, dense_hists)
from .merge import merge


def read(path: str) -> Capture:
    """The capture; of a file holding several processes, their merged view (merge()), each
    process's own capture in its `.processes`."""
    caps = read_processes(path)
    return caps[0] if len(caps) == 1 else merge(caps)


def read_processes(path: str) -> list[Capture]:
    """Each process's capture, in the order they were attached."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise CaptureError(f"cannot open {path}: {e.strerror}") from None
    with f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise CaptureError(f"{path} is not a memhook capture (too short)")
        magic, version, _ = HEADER.unpack(head)
        if magic != MAGIC:
            raise CaptureError(f"{path} is not a memhook capture (bad magic)")
        if version != VERSION:
            raise CaptureError(f"{path} is capture format {version}; this memhook reads "
                               f"format {VERSION}")
        states = {0: _Assembly()}
        state = states[0]
        while True:
            hdr = f.read(BLOCK.size)
            if len(hdr) < BLOCK.size:
                break  # cut off: keep what was complete
            kind, crc, length = BLOCK.unpack(hdr)
            if length > MAX_BLOCK:
                break
            data = f.read(length)
            if len(data) < length or zlib.crc32(data) != crc:
                break
            if kind == b"END ":
                for st in states.values():
                    st.cap.complete = True
                break
            try:
                if kind == b"PROC":
                    index = json.loads(zlib.decompress(data))["index"]
                    if not isinstance(index, int) or not 0 <= index <= MAX_PROCESSES:
                        raise ValueError("process index out of range")
                    state = states.setdefault(index, _Assembly())
                    continue
                state.add(kind, zlib.decompress(data))
            except Exception as e:  # any damage inside a block is the file's, not ours
                raise CaptureError(f"{path}: damaged {kind.decode(errors='replace')!r} block "
                                   f"({type(e).__name__})") from None
    # A process that was to be attached but never was (it refused) wrote nothing.
    return [states[i].finish(path) for i in sorted(states) if states[i].cap.meta or i == 0]


def _is_u64(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64


# Fields a report reads, and what they must be; other fields are kept as they are.
META_TYPES = {"pid": (int, type(None)), "command": (str, type(None)), "libc": (str,),
              "duration_s": (int, float, type(None)), "started_at": (int, float, type(None)),
              "totals": (dict,)}


def _checked_meta(meta) -> dict:
    if not isinstance(meta, dict):
        raise ValueError("metadata is not an object")
    for key, types in META_TYPES.items():
        if key in meta and (not isinstance(meta[key], types) or isinstance(meta[key], bool)):
            raise ValueError(f"metadata field {key} has the wrong type")
    if not all(_is_u64(v) for v in meta.get("totals", {}).values()):
        raise ValueError("totals are not counts")
    return meta


def _checked_modules(mods) -> list:
    if not isinstance(mods, list):
        raise ValueError("module table is not a list")
    for m in mods:
        if not (isinstance(m, dict) and isinstance(m.get("path"), str)
                and isinstance(m.get("build_id", ""), str)
                and all(_is_u64(m.get(k)) for k in ("bias", "lo", "hi"))
                and all(_is_u64(m.get(k, 0)) for k in ("size", "mtime"))):
            raise ValueError("module record malformed")
    return mods


def _site_columns(names: set) -> bool:
    return set(SITE_COLUMNS) <= names <= set(SITE_COLUMNS + UNCERTAIN_COLUMNS + PEAK_COLUMNS)


def _padded(a: np.ndarray, pad: int) -> np.ndarray:
    """`a` as uint64 with `pad` rows of zeros after it, copied only when that takes a copy (a
    Python program's 349,000 stacks had 134 MB a histogram, copied twice per report)."""
    a = a.astype(np.uint64, copy=False)
    return np.concatenate([a, np.zeros((pad,) + a.shape[1:], np.uint64)]) if pad else a


def _load_npz(payload: bytes) -> dict:
    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


class _Assembly:
    def __init__(self):
        self.cap = Capture()
        self.offsets = [np.zeros(1, np.uint64)]
        self.frames = []
        self.stacks = 0
        self.series: dict = {}
        self.events = []

    def add(self, kind: bytes, payload: bytes) -> None:
        if kind == b"META":
            self.cap.meta.update(_checked_meta(json.loads(payload)))
        elif kind == b"MODS":
            self.cap.modules = _checked_modules(json.loads(payload))
        elif kind == b"STKS":
            z = _load_npz(payload)
            first, offsets, frames = int(z["first"]), z["offsets"].astype(np.uint64), z["frames"]
            if first != self.stacks or len(offsets) < 1 or np.any(np.diff(offsets.astype(
                    np.int64)) < 0) or int(offsets[-1] - offsets[0]) != len(frames):
                raise ValueError("stack block out of sequence")
            base = int(self.offsets[-1][-1])
            self.offsets.append((offsets[1:] - offsets[0] + base).astype(np.uint64))
            self.frames.append(frames.astype(np.uint64))
            self.stacks += len(offsets) - 1
        elif kind == b"AGGR":
            z = _load_npz(payload)
            if not _site_columns(set(z)) or len({len(v) for v in z.values()}) != 1:
                raise ValueError("aggregate columns do not match")
            self.cap.sites = {k: v.astype(np.uint64) for k, v in z.items()}
        elif kind == b"AGGD":  # a checkpoint: the rows of stacks that changed since the last
            z = _load_npz(payload)
            if not _site_columns(set(z) - {"id"}) or "id" not in z or \
                    len({len(v) for v in z.values()}) != 1:
                raise ValueError("aggregate columns do not match")
            ids = z["id"].astype(np.int64)
            if len(ids) and (ids.min() < 0 or ids.max() >= self.stacks):
                raise ValueError("aggregates name stacks the capture does not hold")
            n = max(len(next(iter(self.cap.sites.values()), [])), int(ids.max(initial=-1)) + 1)
            for k in set(z) - {"id"}:
                col = self.cap.sites.get(k, np.zeros(0, np.uint64))
                col = np.concatenate([col, np.zeros(n - len(col), np.uint64)])
                col[ids] = z[k].astype(np.uint64)
                self.cap.sites[k] = col
        elif kind == b"TSER":
            for k, v in _load_npz(payload).items():
                self.series.setdefault(k, []).append(v)
        elif kind == b"BEHV":
            z = dense_hists(_load_npz(payload))
            required = set(BEHAVIOUR_ROWS + BEHAVIOUR_HISTS + BEHAVIOUR_PAIRS)
            if not required <= set(z) <= required | set(BEHAVIOUR_LATER_HISTS):
                raise ValueError("behaviour columns do not match")
            if "lifetime_unresolved_hist" not in z:
                z["lifetime_unresolved_hist"] = np.zeros_like(z["lifetime_hist"])
            hists = BEHAVIOUR_HISTS + BEHAVIOUR_LATER_HISTS
            rows = {len(z[k]) for k in BEHAVIOUR_ROWS} | {len(z[k]) for k in hists}
            if len(rows) != 1 or any(z[k].ndim != 2 for k in hists) or \
                    len({len(z[k]) for k in BEHAVIOUR_PAIRS}) != 1:
                raise ValueError("behaviour arrays do not match")
            self.cap.behaviour = z
        elif kind == b"LIVE":
            z = _load_npz(payload)
            if set(z) != set(LIVE_COLUMNS) or len({len(v) for v in z.values()}) != 1:
                raise ValueError("live block columns do not match")
            self.cap.live = z
        elif kind == b"PMAP":
            from . import perf_map  # (a JIT runtime's capture only)
            value = json.loads(payload)
            into = perf_map.PerfMap(**{k: v for k, v in self.cap.jit_map.items()
                                       if k in ("name", "entries", "cut")})
            if isinstance(value, dict) and value.get("whole"):  # (written again: replaces it)
                into.entries = []
            perf_map.from_json(value, into)
            self.cap.jit_map = {"name": into.name, "entries": into.entries, "cut": into.cut}
        elif kind == b"PYCO":
            python_code.from_json(json.loads(payload), self.cap.python_code)
        elif kind == b"SNAP":
            self.cap.snapshots.append(snapshots.parse(_load_npz(payload), self.stacks))
        elif kind == b"EVTS":
            z = _load_npz(payload)
            self.events.append(np.rec.fromarrays([z[n] for n in EVENT_DTYPE.names
                                                  if n != "pad"],
                                                 names=[n for n in EVENT_DTYPE.names
                                                        if n != "pad"]))
        # Unknown kinds are skipped: newer writers may add blocks.

    def finish(self, path: str) -> Capture:
        cap = self.cap
        if not cap.meta:
            raise CaptureError(f"{path} holds no complete metadata block")
        cap.stack_offsets = np.concatenate(self.offsets)
        cap.stack_frames = (np.concatenate(self.frames) if self.frames
                            else np.zeros(0, np.uint64))
        n = cap.stack_count  # stack ids count from 0, the "no stack" row
        if max((len(v) for v in cap.sites.values()), default=0) > n:
            raise CaptureError(f"{path}: aggregates name stacks the capture does not hold")
        # Stacks that appeared after the last snapshot have no aggregates yet: zeros.
        cap.sites = {k: np.concatenate([col, np.zeros(n - len(col), np.uint64)])
                     for k in SITE_COLUMNS + UNCERTAIN_COLUMNS + PEAK_COLUMNS
                     if k in cap.sites or k not in PEAK_COLUMNS
                     for col in [cap.sites.get(k, np.zeros(0, np.uint64))]}
        b = cap.behaviour
        if b is not None:
            have = len(b["temporary"])
            if have > n or int(np.max(b["pair_stack"], initial=0)) >= max(have, 1):
                raise CaptureError(f"{path}: behaviour names stacks the capture does not hold")
            for k in BEHAVIOUR_ROWS + BEHAVIOUR_HISTS + BEHAVIOUR_LATER_HISTS:
                b[k] = _padded(b[k], n - have)
        cap.series = {k: np.concatenate(v) for k, v in self.series.items()}
        if self.events:
            cap.events = np.concatenate(self.events)
        return cap
