"""Snapshots (issue 34): the aggregates at one moment of a session, kept beside the final ones.
A snapshot is taken on demand (SIGUSR1 to memhook, `memhook snapshot PID`) or when a condition
first holds (--snapshot-when: rss>, heap>, memory pressure); the recorder writes it as a SNAP
block at once, so that a target the OOM killer ends, or a memhook that dies, still leaves it.
`memhook report FILE --snapshot N` reports on one, `--diff M` compares two of one capture."""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from .format import SITE_COLUMNS, UNCERTAIN_COLUMNS, Capture

# What a SNAP block's JSON says besides the aggregates.
FIELDS = ("number", "time_s", "reason", "totals", "rss_bytes", "leak_check")


def block(info: dict, sites: dict, ids: np.ndarray | None = None) -> dict:
    """A SNAP block's arrays: `meta_json` (the info as UTF-8 JSON bytes), `id` (the stacks with
    any activity, unless `ids` says which rows `sites` holds) and their SITE_COLUMNS."""
    if ids is None:
        ids = np.flatnonzero(sites["alloc_count"] | sites["free_count"])
        sites = {k: sites[k][ids] for k in SITE_COLUMNS}
    return {"meta_json": np.frombuffer(json.dumps(info).encode(), np.uint8),
            "id": np.asarray(ids, np.uint64), **{k: sites[k] for k in SITE_COLUMNS}}


def parse(z: dict, stacks: int) -> dict:
    """A SNAP block read back: its info, and `sites` ({id, columns}); ValueError if damaged."""
    if set(z) != {"meta_json", "id", *SITE_COLUMNS} or \
            len({len(z[k]) for k in ("id", *SITE_COLUMNS)}) != 1:
        raise ValueError("snapshot columns do not match")
    info = json.loads(bytes(z["meta_json"].astype(np.uint8)).decode())
    if not isinstance(info, dict) or not isinstance(info.get("number"), int) or \
            not isinstance(info.get("time_s"), (int, float)):
        raise ValueError("snapshot metadata malformed")
    ids = z["id"].astype(np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= stacks):
        raise ValueError("snapshot names stacks the capture does not hold")
    return {**{k: info.get(k) for k in FIELDS},
            "sites": {"id": ids, **{k: z[k].astype(np.uint64) for k in SITE_COLUMNS}}}


def numbers(cap: Capture) -> list[int]:
    """The snapshots a capture holds, by number (in a capture of several processes, those any
    of them holds)."""
    caps = cap.processes or [cap]
    return sorted({s["number"] for c in caps for s in c.snapshots})


def listing(cap: Capture) -> list[dict]:
    """Each snapshot in a line's worth: number, time, reason, outstanding bytes and blocks (summed
    over the processes that took it), resident bytes."""
    out = {}
    for c in cap.processes or [cap]:
        for s in c.snapshots:
            row = out.setdefault(s["number"], {"number": s["number"], "time_s": s["time_s"],
                                               "reason": s["reason"], "outstanding_bytes": 0,
                                               "outstanding_count": 0, "rss_bytes": 0})
            row["outstanding_bytes"] += int(s["sites"]["outstanding_bytes"].sum())
            row["outstanding_count"] += int(s["sites"]["outstanding_count"].sum())
            row["rss_bytes"] += int(s.get("rss_bytes") or 0)
    return [out[n] for n in sorted(out)]


def at(cap: Capture, number: int) -> Capture:
    """The capture as it was at snapshot `number`: its aggregates, totals and time; the series
    up to that moment. A capture of several processes: those that took it, merged."""
    if cap.processes:
        from .merge import merge
        caps = [at(c, number) for c in cap.processes
                if any(s["number"] == number for s in c.snapshots)]
        if not caps:
            raise KeyError(number)
        return caps[0] if len(caps) == 1 else merge(caps)
    snap = next((s for s in cap.snapshots if s["number"] == number), None)
    if snap is None:
        raise KeyError(number)
    n = cap.stack_count
    sites = {k: np.zeros(n, np.uint64) for k in SITE_COLUMNS + UNCERTAIN_COLUMNS}
    for k in SITE_COLUMNS:  # (uncertain blocks are known at detach only)
        sites[k][snap["sites"]["id"]] = snap["sites"][k]
    totals = {**cap.meta.get("totals", {}), **(snap.get("totals") or {})}
    meta = {**cap.meta, "totals": totals, "duration_s": snap["time_s"],
            "end_reason": f"snapshot {number} ({snap['reason']})",
            "leak_check": snap.get("leak_check") or {}}  # (the one taken then, if any)
    t = snap["time_s"]
    series = {}
    for k, v in cap.series.items():  # (each column is timed by its own time column)
        clock = "top_time_s" if k.startswith("top_") else \
            "stk_time_s" if k.startswith("stk_") else "time_s"
        times = cap.series.get(clock)
        series[k] = v[times <= t] if times is not None and len(times) == len(v) else v
    return dataclasses.replace(cap, meta=meta, sites=sites, series=series, behaviour=None,
                               events=None, live=None, processes=[], by_process=None)
