"""Capture files: what a session saw, raw (return addresses, never symbols), to report on later,
on this host or another.

A 24-byte header (magic, format version), then blocks appended as the session goes, each
  kind (4 bytes) | crc32 of payload (u32) | payload length (u64) | zlib-compressed payload
so a capture cut off by a crash or kill -9 reads up to its last complete block. The blocks
and their columns: docs/capture-format.md (the one description; keep it in step with this file).
"""
from __future__ import annotations

import io
import json
import struct
import time
import zlib
from dataclasses import asdict, dataclass, field

import numpy as np

from . import procfs

MAGIC = b"MEMHOOK\0CAPTURE\0"
VERSION = 1
HEADER = struct.Struct("<16sII")
BLOCK = struct.Struct("<4sIQ")
MAX_BLOCK = 1 << 32
MAX_PROCESSES = 1 << 20
SITE_COLUMNS = ("alloc_count", "alloc_bytes", "free_count", "free_bytes", "outstanding_count",
                "outstanding_bytes", "op_mask")
# Since the dropped-free reconciliation (0 where a capture has none): outstanding blocks and
# bytes per stack that may have been freed unrecorded.
UNCERTAIN_COLUMNS = ("uncertain_count", "uncertain_bytes")
SERIES_COLUMNS = ("time_s", "outstanding_bytes", "outstanding_count", "alloc_count",
                  "free_count", "dropped_events")
MEMORY_COLUMNS = ("rss_bytes", "anon_bytes", "heap_bytes")  # of the process, per row
LIVE_COLUMNS = ("ptr", "size", "stack", "tid", "ts")
BEHAVIOUR_ROWS = ("freed_same_thread", "freed_other_thread", "temporary", "freed_same_call")
BEHAVIOUR_HISTS = ("size_hist", "lifetime_hist", "age_hist")
# Since lifetimes carry their resolution (zeros where a capture has none): lifetimes known only
# to lie under a bound, by that bound's bucket.
BEHAVIOUR_LATER_HISTS = ("lifetime_unresolved_hist",)
BEHAVIOUR_PAIRS = ("pair_stack", "pair_alloc_tid", "pair_free_tid", "pair_count")
TOP_STACKS = 20  # stacks sampled in the time series per interval
TICK_CHUNKS = ("top_time_s", "top_stack", "top_bytes", "stk_time_s", "stk_id", "stk_bytes")
# What a live session holds in memory for its final report before it halves the series'
# resolution (capture files keep every tick): ticks, and per-stack changes (24 bytes each).
MAX_TICKS = 2048
MAX_CHANGES = 2_000_000
EVENT_DTYPE = np.dtype([("ts", "<u8"), ("ptr", "<u8"), ("size", "<u8"), ("stack", "<u4"),
                        ("tid", "<u4"), ("op", "u1"), ("is_free", "u1"), ("pad", "V6")])


class CaptureError(Exception):
    """A capture file that cannot be read, with a one-line reason."""


@dataclass
class Capture:
    meta: dict = field(default_factory=dict)
    modules: list = field(default_factory=list)
    sites: dict = field(default_factory=dict)      # SITE_COLUMNS -> array indexed by stack id
    stack_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.uint64))
    stack_frames: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    # SERIES_COLUMNS and MEMORY_COLUMNS per row; top_time_s/top_stack/top_bytes for the largest
    # stacks; stk_time_s/stk_id/stk_bytes whenever a stack's outstanding bytes changed
    series: dict = field(default_factory=dict)
    events: np.ndarray | None = None               # EVENT_DTYPE without pad, ts in ns since start
    complete: bool = False
    live: dict | None = None                       # LIVE_COLUMNS, ts in ns since start
    behaviour: dict | None = None                  # BEHAVIOUR_* arrays
    # A merged capture (merge()): the processes' own captures, and per process (rows, in that
    # order) and merged stack (columns) their outstanding bytes and blocks; stack_map: per
    # process, the merged id of each of its stacks.
    processes: list = field(default_factory=list)
    by_process: dict | None = None

    @property
    def stack_count(self) -> int:
        return len(self.stack_offsets) - 1

    def frames(self, stack: int) -> np.ndarray:
        return self.stack_frames[int(self.stack_offsets[stack]):int(self.stack_offsets[stack + 1])]


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


class Writer:
    def __init__(self, path: str):
        self._f = open(path, "wb")
        self._f.write(HEADER.pack(MAGIC, VERSION, 0))
        self.bytes = HEADER.size

    def block(self, kind: bytes, payload: bytes) -> None:
        data = zlib.compress(payload, 6)
        self._f.write(BLOCK.pack(kind, zlib.crc32(data), len(data)) + data)
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
    if cap.series:
        w.arrays(b"TSER", **cap.series)
    if cap.events is not None:
        w.arrays(b"EVTS", **{n: cap.events[n] for n in cap.events.dtype.names})
    if cap.behaviour is not None:
        w.arrays(b"BEHV", **cap.behaviour)
    if cap.live is not None:
        w.arrays(b"LIVE", **cap.live)
    w.close()


# ---- Reading ----

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
META_TYPES = {"pid": (int, type(None)), "command": (str, type(None)),
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
    return set(SITE_COLUMNS) <= names <= set(SITE_COLUMNS + UNCERTAIN_COLUMNS)


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
            z = _load_npz(payload)
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
                     for k in SITE_COLUMNS + UNCERTAIN_COLUMNS
                     for col in [cap.sites.get(k, np.zeros(0, np.uint64))]}
        b = cap.behaviour
        if b is not None:
            have = len(b["temporary"])
            if have > n or int(np.max(b["pair_stack"], initial=0)) >= max(have, 1):
                raise CaptureError(f"{path}: behaviour names stacks the capture does not hold")
            pad = n - have
            for k in BEHAVIOUR_ROWS:
                b[k] = np.concatenate([b[k].astype(np.uint64), np.zeros(pad, np.uint64)])
            for k in BEHAVIOUR_HISTS + BEHAVIOUR_LATER_HISTS:
                b[k] = np.concatenate([b[k].astype(np.uint64),
                                       np.zeros((pad, b[k].shape[1]), np.uint64)])
        cap.series = {k: np.concatenate(v) for k, v in self.series.items()}
        if self.events:
            cap.events = np.concatenate(self.events)
        return cap


# ---- Recording a live session ----

@dataclass
class Recorder:
    """Follows a live session: samples the time series every tick, and (with a path) appends
    new stacks, snapshots of the aggregates and events to the capture file as it goes."""

    session: object
    path: str | None = None
    snapshot_every: float = 60.0
    record_events: bool = False
    writer: Writer | None = None
    stacks_written: int = 0
    ticks: list = field(default_factory=list)  # per tick: its series row and top/stk chunk
    held: int = 0  # stk entries in ticks
    _last_out: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    events: list = field(default_factory=list)
    modules_written: int = -1
    _last_sites: dict = field(default_factory=dict)
    _last_snapshot: float = 0.0
    _t0: float = field(default_factory=time.monotonic)

    def __post_init__(self):
        if self.path:
            self.writer = Writer(self.path)

    def start(self) -> None:
        """Once attached."""
        if self.record_events:
            self.session.consumer.record_events(True)
        if self.writer:
            self.writer.json(b"META", self.session.metadata())
            self._modules()
        self._t0 = self._last_snapshot = time.monotonic()

    def _modules(self) -> None:
        if self.writer and len(self.session.modules) != self.modules_written:
            self.writer.json(b"MODS", module_table(self.session.modules.values()))
            self.modules_written = len(self.session.modules)

    def _stacks(self) -> None:
        offsets, frames = self.session.consumer.stacks(self.stacks_written)
        if len(offsets) > 1:
            if self.writer:
                self.writer.arrays(b"STKS", first=np.array(self.stacks_written, np.uint64),
                                   offsets=offsets, frames=frames)
            self.stacks_written += len(offsets) - 1

    def _events(self) -> np.ndarray | None:
        if not self.record_events:
            return None
        consumer = self.session.consumer
        raw = np.frombuffer(consumer.take_events(), dtype=EVENT_DTYPE)
        ev = np.rec.fromarrays([raw[n] for n in EVENT_DTYPE.names if n != "pad"],
                               names=[n for n in EVENT_DTYPE.names if n != "pad"])
        ev["ts"] = self._ns_since_start(ev["ts"]).astype(np.uint64)
        return ev

    def tick(self, final: bool = False) -> None:
        consumer = self.session.consumer
        now = time.monotonic() - self._t0
        totals = consumer.totals()
        row = {"time_s": now, **{k: totals[k] for k in SERIES_COLUMNS[1:]},
               **procfs.memory(self.session.pid)}
        out = consumer.sites()["outstanding_bytes"]
        top = np.argsort(-out.astype(np.float64))[:TOP_STACKS]
        top = top[out[top] > 0]
        last = np.concatenate([self._last_out, np.zeros(len(out) - len(self._last_out), np.uint64)])
        changed = np.nonzero(out != last)[0]
        self._last_out = out
        chunk = {"top_time_s": np.full(len(top), now), "top_stack": top.astype(np.uint64),
                 "top_bytes": out[top], "stk_time_s": np.full(len(changed), now),
                 "stk_id": changed.astype(np.uint64), "stk_bytes": out[changed]}
        self.ticks.append((row, chunk))
        self.held += len(changed)
        if len(self.ticks) > MAX_TICKS or self.held > MAX_CHANGES:
            self._thin()
        ev = self._events()
        if ev is not None:
            self.events.append(ev)
        if not self.writer:
            return
        self._modules()
        self._stacks()
        self.writer.arrays(b"TSER", **{k: np.asarray([row[k]]) for k in row}, **chunk)
        if ev is not None and len(ev):
            self.writer.arrays(b"EVTS", **{n: ev[n] for n in ev.dtype.names})
        if final or time.monotonic() - self._last_snapshot >= self.snapshot_every:
            self.writer.arrays(b"AGGR", **consumer.sites())
            self.writer.arrays(b"BEHV", **consumer.behaviour())
            self._last_snapshot = time.monotonic()
        self.checkpoint(totals)

    def checkpoint(self, totals: dict | None = None) -> None:
        """What a capture cut off from here on still reports: new stacks, the aggregates of the
        stacks that changed since the last checkpoint, the totals and the time traced."""
        if not self.writer:
            return
        consumer = self.session.consumer
        totals = totals or consumer.totals()
        self._modules()
        self._stacks()
        # Only stacks the file holds (one may have appeared since _stacks()): the next checkpoint
        # writes the others.
        sites = {k: v[:self.stacks_written] for k, v in consumer.sites().items()}
        n = len(sites["alloc_count"])
        changed = np.zeros(n, bool)
        for k, v in sites.items():
            last = self._last_sites.get(k, np.zeros(0, np.uint64))[:n]
            changed |= v != np.concatenate([last, np.zeros(n - len(last), v.dtype)])
        ids = np.flatnonzero(changed)
        if len(ids):
            self.writer.arrays(b"AGGD", id=ids.astype(np.uint64),
                               **{k: v[ids] for k, v in sites.items()})
        self._last_sites = sites
        self.writer.json(b"META", {"totals": _ints(totals),
                                   "duration_s": round(time.monotonic() - self._t0, 3)})

    def finish(self) -> Capture:
        """After detach: the final tick, the closing blocks, and the whole capture in memory."""
        self.tick(final=True)
        consumer = self.session.consumer
        cap = current(self.session)
        meta = cap.meta
        live = None
        if self.record_events:  # per block: it grows with the heap, so only when asked
            live = consumer.live_blocks()
            live["ts"] = self._ns_since_start(live["ts"]).astype(np.uint64)
        if self.writer:
            self.writer.json(b"META", meta)
            if live is not None:
                self.writer.arrays(b"LIVE", **live)
            self.writer.close()
        cap.series = self.held_series()
        cap.events = np.concatenate(self.events) if self.events else None
        cap.complete, cap.live, cap.behaviour = True, live, consumer.behaviour()
        return cap

    def held_series(self) -> dict:
        """The time series held for the final report (TSER's columns)."""
        series = {k: np.asarray([row[k] for row, _ in self.ticks])
                  for k in SERIES_COLUMNS + MEMORY_COLUMNS}
        series.update({k: np.concatenate([c[k] for _, c in self.ticks]).astype(
            np.float64 if k.endswith("time_s") else np.uint64) for k in TICK_CHUNKS})
        return series

    def _thin(self) -> None:
        """Halve the time resolution of what is held for the final report (the file keeps every
        tick): of each pair of ticks the later one stays, and the stacks that changed only in
        the earlier one are carried into it. A session of days holds a bounded series."""
        kept = []
        for i in range(0, len(self.ticks) - 1, 2):
            (_, early), (row, late) = self.ticks[i], self.ticks[i + 1]
            carried = ~np.isin(early["stk_id"], late["stk_id"])
            late = {**late, **{k: np.concatenate([early[k][carried], late[k]])
                               for k in ("stk_id", "stk_bytes")}}
            late["stk_time_s"] = np.full(len(late["stk_id"]), row["time_s"])
            kept.append((row, late))
        kept += self.ticks[len(kept) * 2:]  # an odd last tick stays as it is
        self.ticks = kept
        self.held = sum(len(c["stk_id"]) for _, c in kept)

    def _ns_since_start(self, raw: np.ndarray) -> np.ndarray:
        consumer = self.session.consumer
        return np.maximum(raw.astype(np.float64) - consumer.clock_origin, 0) * \
            consumer.ticks_to_ns()


def current(session) -> Capture:
    """What a session's consumer holds now, as a capture of metadata, totals, modules, stacks and
    their aggregates (no series): the final report's base, and each OTLP push's."""
    consumer = session.consumer
    meta = {**session.metadata(), "totals": _ints(consumer.totals())}
    offsets, frames = consumer.stacks(0)
    # Stacks interned after the aggregates were read have no row yet; rows past the stacks read
    # are for stacks not read.
    n = len(offsets) - 1
    sites = {k: v.astype(np.uint64)[:n] for k, v in consumer.sites().items()}
    return Capture(meta, module_table(session.modules.values()), sites, offsets.astype(np.uint64),
                   frames.astype(np.uint64))


def _ints(d: dict) -> dict:
    return {k: int(v) for k, v in d.items()}


def module_table(modules) -> list:
    return [{k: v for k, v in asdict(m).items() if k != "file"} for m in modules]


# ---- Several processes ----

MERGED_BASE = 1 << 60  # merged modules' addresses: above any user-space address (< 2^47)
MERGED_SPAN = 1 << 44  # per module: more than any ELF file's address range


def merge(caps: list[Capture]) -> Capture:
    """The processes' captures as one: a module file (by build-id, else path) gets one place in
    a common address space, each frame moves with its module, and stacks that become equal
    are one, their aggregates summed (the same identity --diff matches stacks by). Frames in no
    module keep their addresses. No time series or behaviour: those stay per process."""
    modules: dict = {}  # key -> merged module record
    offsets, frames, index = [0, 0], [], {}  # merged stacks (0: none), interned by frames
    columns = SITE_COLUMNS + UNCERTAIN_COLUMNS
    rows = []  # per process: merged stack id of each of its stacks
    for cap in caps:
        mods = sorted(cap.modules, key=lambda m: m["lo"])
        los = np.array([m["lo"] for m in mods], np.uint64)
        shift = np.zeros(len(mods), np.int64)
        for i, m in enumerate(mods):
            key = m.get("build_id") or m["path"]
            if key not in modules:
                bias = MERGED_BASE + len(modules) * MERGED_SPAN
                modules[key] = {**m, "bias": bias, "lo": m["lo"] - m["bias"] + bias,
                                "hi": m["hi"] - m["bias"] + bias}
            shift[i] = modules[key]["bias"] - m["bias"]  # wraps like the addresses do
        f = cap.stack_frames.astype(np.uint64)
        at = np.searchsorted(los, f, side="right").astype(np.int64) - 1
        his = np.array([m["hi"] for m in mods], np.uint64)
        inside = (at >= 0) & (f < his[np.maximum(at, 0)]) if len(mods) else np.zeros(len(f), bool)
        moved = f.copy()
        moved[inside] = f[inside] + shift[at[inside]].astype(np.uint64)
        ids = np.zeros(cap.stack_count, np.int64)
        for s in range(1, cap.stack_count):
            key = moved[int(cap.stack_offsets[s]):int(cap.stack_offsets[s + 1])].tobytes()
            if key not in index:
                index[key] = len(offsets) - 1
                frames.append(moved[int(cap.stack_offsets[s]):int(cap.stack_offsets[s + 1])])
                offsets.append(offsets[-1] + len(frames[-1]))
            ids[s] = index[key]
        rows.append(ids)
    n = len(offsets) - 1
    sites = {k: np.zeros(n, np.uint64) for k in columns}
    per = {k: np.zeros((len(caps), n), np.uint64) for k in ("outstanding_bytes",
                                                            "outstanding_count")}
    for p, (cap, ids) in enumerate(zip(caps, rows)):
        for k in columns:
            col = cap.sites[k][:len(ids)]
            if k == "op_mask":
                np.bitwise_or.at(sites[k], ids, col)
            else:
                np.add.at(sites[k], ids, col)
        for k in per:
            np.add.at(per[k][p], ids, cap.sites[k][:len(ids)])
        sites["op_mask"][0] = 0
    behaviour = None
    if all(c.behaviour is not None for c in caps) and caps:
        # Summed per merged stack; thread pairs stay per process (thread ids are).
        first = caps[0].behaviour
        behaviour = {k: np.zeros((n,) + first[k].shape[1:], np.uint64)
                     for k in BEHAVIOUR_ROWS + BEHAVIOUR_HISTS + BEHAVIOUR_LATER_HISTS}
        behaviour.update({k: np.zeros(0, np.uint64) for k in BEHAVIOUR_PAIRS})
        for cap, ids in zip(caps, rows):
            for k in BEHAVIOUR_ROWS + BEHAVIOUR_HISTS + BEHAVIOUR_LATER_HISTS:
                np.add.at(behaviour[k], ids, cap.behaviour[k][:len(ids)].astype(np.uint64))
    metas = [c.meta for c in caps]
    totals: dict = {}
    for m in metas:
        for k, v in m.get("totals", {}).items():
            totals[k] = totals.get(k, 0) + v
    if metas and metas[0].get("totals", {}).get("sample_rate"):
        totals["sample_rate"] = metas[0]["totals"]["sample_rate"]  # every session's own
    starts = [m["started_at"] for m in metas if m.get("started_at")]
    ends = [m.get("ended_at") or 0 for m in metas]
    meta = {"pid": None, "command": f"{len(caps)} processes: " + ", ".join(
                f"{m.get('pid')} ({m.get('command') or '?'})" for m in metas),
            "host": metas[0].get("host") if metas else None,
            "started_at": min(starts, default=0.0), "ended_at": max(ends, default=0.0),
            "duration_s": round(max(ends, default=0.0) - min(starts, default=0.0), 3)
            if all(ends) and starts else max((m.get("duration_s") or 0 for m in metas),
                                             default=0.0),
            "sample_rate": metas[0].get("sample_rate", 0) if metas else 0,
            "totals": totals, "processes": [m.get("pid") for m in metas]}
    return Capture(meta, list(modules.values()), sites, np.array(offsets, np.uint64),
                   np.concatenate(frames) if frames else np.zeros(0, np.uint64),
                   complete=all(c.complete for c in caps), processes=caps, behaviour=behaviour,
                   by_process={"pid": np.array([m.get("pid") or 0 for m in metas], np.int64),
                               "stack_map": rows, **per})
