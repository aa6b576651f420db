"""Recording a live session: the time series every tick, and (with a capture file) new stacks,
snapshots of the aggregates and events appended as the session goes."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..common import procfs, resident
from . import perf_map, python_code, snapshots
from .format import (EVENT_DTYPE, MEMORY_COLUMNS, PART_COLUMNS, SERIES_COLUMNS, SITE_COLUMNS,
                     TICK_CHUNKS, TOP_STACKS, Capture, dense_hists)
from .writer import Writer

# What a live session holds in memory for its final report before it halves the series'
# resolution (capture files keep every tick): ticks, and per-stack changes (24 bytes each).
MAX_TICKS = 2048
MAX_CHANGES = 2_000_000
# Frames per STKS block at most: the new stacks of a tick are copied out of the consumer and
# compressed a block at a time (a Python program's import made 200 MB of them in a second,
# held twice over while written whole).
STACK_CHUNK = 1 << 20


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
    snapshots: list = field(default_factory=list)  # snapshot() taken, as Capture.snapshots

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
        # Code records first: a stack's Python frames name records written before its event.
        new = python_code.read_new(self.session)
        if new and self.writer:
            self.writer.json(b"PYCO", python_code.to_json(new))
        jit = read_perf_map(self.session)
        if jit and self.writer:
            m = self.session.perf_map
            self.writer.json(b"PMAP", perf_map.to_json(jit, m.name, m.cut, m.rewritten))
            m.rewritten = False
        while True:  # (a chunk at a time: a burst's new stacks are 100s of MB of frames)
            offsets, frames = self.session.consumer.stacks(self.stacks_written, STACK_CHUNK)
            if len(offsets) <= 1:
                return
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
        # What was published until now: the drain thread applies it only now and then
        # (consumer.h); the final tick comes after the final drain.
        if not final:
            consumer.drain()
        if not self.writer:  # (the live view names Python and JIT frames by them)
            python_code.read_new(self.session)
            read_perf_map(self.session)
        now = time.monotonic() - self._t0
        totals = consumer.totals()
        row = {"time_s": now, **{k: totals[k] for k in SERIES_COLUMNS[1:]},
               **procfs.memory(self.session.pid)}
        row.update(dict.fromkeys(PART_COLUMNS, 0) | resident.kind_totals(self.session.pid))
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
        self.writer.json(b"META", {"totals": totals_now(self.session, totals),
                                   "duration_s": round(time.monotonic() - self._t0, 3)})

    def seconds(self) -> float:
        """Seconds since recording began: what snapshots' time_s counts."""
        return time.monotonic() - self._t0

    def snapshot(self, reason: str, number: int | None = None) -> dict:
        """The aggregates now, kept as snapshot `number` (the next one unless given) and written
        at once as a SNAP block after a checkpoint (its stacks in the file before it)."""
        consumer = self.session.consumer
        consumer.drain()  # what was published until now, as tick()
        self.checkpoint()
        n = self.stacks_written if self.writer else len(consumer.stacks(0)[0]) - 1
        sites = {k: v[:n].astype(np.uint64) for k, v in consumer.sites().items()}
        info = {"number": number or len(self.snapshots) + 1,
                "time_s": round(time.monotonic() - self._t0, 3), "reason": reason,
                "totals": totals_now(self.session),
                "rss_bytes": procfs.memory(self.session.pid).get("rss_bytes", 0)}
        if self.session.options.reachability and self.session.target_alive():
            # The leak check on demand: which of the blocks held now no pointer reaches.
            from ..reachability.check import check  # (a live session's: reports need not)
            info["leak_check"] = check(self.session)
            info["leak_check"]["when"] = "snapshot"
        arrays = snapshots.block(info, sites)
        if self.writer:
            self.writer.arrays(b"SNAP", **arrays)
        snap = {**info, "sites": {"id": arrays["id"].astype(np.int64),
                                  **{k: arrays[k] for k in SITE_COLUMNS}}}
        self.snapshots.append(snap)
        return snap

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
        cap.complete, cap.live, cap.behaviour = True, live, dense_hists(consumer.behaviour())
        cap.snapshots = self.snapshots
        return cap

    def recent(self, stacks, n: int) -> tuple[np.ndarray, dict]:
        """The times of the last `n` ticks held, and each of `stacks`' outstanding bytes at
        them (from the ticks' changes: a stack's value holds until it next changes)."""
        window = self.ticks[-n:]
        times = np.array([row["time_s"] for row, _ in window], np.float64)
        start = times[0] if len(times) else 0.0
        changes: dict = {int(s): [] for s in stacks}  # newest first: (time, bytes)
        open_ = set(changes)  # stacks with no change found at or before the window's start
        for _, chunk in reversed(self.ticks):
            if not open_:
                break
            at = chunk["stk_time_s"][0] if len(chunk["stk_time_s"]) else None
            for s in list(open_):
                hit = np.flatnonzero(chunk["stk_id"] == s)
                if len(hit):
                    changes[s].append((float(at), float(chunk["stk_bytes"][hit[-1]])))
                    if at <= start:
                        open_.discard(s)
        series = {}
        for s, ch in changes.items():
            ch.reverse()
            t = np.array([c[0] for c in ch], np.float64)
            v = np.array([c[1] for c in ch], np.float64)
            i = np.searchsorted(t, times, side="right") - 1
            series[s] = np.where(i >= 0, v[np.maximum(i, 0)] if len(v) else 0.0, 0.0)
        return times, series

    def held_series(self) -> dict:
        """The time series held for the final report (TSER's columns)."""
        series = {k: np.asarray([row[k] for row, _ in self.ticks])
                  for k in SERIES_COLUMNS + MEMORY_COLUMNS + PART_COLUMNS}
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
    meta = {**session.metadata(), "totals": totals_now(session)}
    offsets, frames = consumer.stacks(0)
    # Stacks interned after the aggregates were read have no row yet; rows past the stacks read
    # are for stacks not read.
    n = len(offsets) - 1
    sites = {k: v.astype(np.uint64)[:n] for k, v in consumer.sites().items()}
    python_code.read_new(session)
    read_perf_map(session)
    m = session.perf_map
    return Capture(meta, module_table(session.modules.values()), sites, offsets.astype(np.uint64),
                   frames.astype(np.uint64), python_code=dict(session.python_code),
                   jit_map={"name": m.name, "entries": list(m.entries), "cut": m.cut} if m
                   else {})


def read_perf_map(session) -> list:
    """The entries the target's perf map gained since the last read (perf_map.py), kept in
    the session's `perf_map`; none once the target is gone."""
    if session.perf_map is None:
        session.perf_map = perf_map.PerfMap()
    if not session.target_alive():
        return []
    return perf_map.read_new(session.pid, session.perf_map)


def totals_now(session, totals: dict | None = None) -> dict:
    """The consumer's totals as a capture keeps them: whole numbers, the peak's moment in ms
    after attach (the consumer gives it on its raw clock)."""
    consumer = session.consumer
    t = dict(totals or consumer.totals())
    raw = t.pop("peak_ts", 0)
    origin = getattr(session, "clock_at_attach", 0) or consumer.clock_origin
    t["peak_time_ms"] = int(max(raw - origin, 0) * consumer.ticks_to_ns() / 1e6
                            ) if raw and t.get("peak_bytes") else 0
    return _ints(t)


def _ints(d: dict) -> dict:
    return {k: int(v) for k, v in d.items()}


def module_table(modules) -> list:
    return [{k: v for k, v in asdict(m).items() if k != "file"} for m in modules]
