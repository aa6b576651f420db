"""Several processes' captures as one: each module file gets one place in a common address
space, frames move with their modules, and stacks that become equal are one."""
from __future__ import annotations

import numpy as np

from .python_code import CODE_MASK, CODE_SHIFT, PYTHON_FRAME
from .format import (BEHAVIOUR_HISTS, BEHAVIOUR_LATER_HISTS, BEHAVIOUR_PAIRS, BEHAVIOUR_ROWS,
                     SITE_COLUMNS, UNCERTAIN_COLUMNS, Capture)


def module_key(module: dict) -> str:
    """A module's identity across processes and hosts: its build-id, else its path."""
    return module.get("build_id") or module["path"]


def stack_key(frames: list, build_ids: dict) -> tuple:
    """A symbolized stack's identity across processes and hosts (what --diff matches): per
    frame its module (module_key) and ELF offset; absolute addresses move with ASLR. merge()
    interns raw stacks by the same identity."""
    return tuple((build_ids.get(f["module"]) or f["module"], f["offset"], bool(f.get("inlined")))
                 if f["module"] else (None, f["address"], False) for f in frames)


MERGED_BASE = 1 << 60  # merged modules' addresses: above any user-space address (< 2^48)
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
    code: dict = {}  # python_code.CodeObject -> its merged number (forked workers share code)
    jit: list = []   # the processes' perf maps, each moved to its own place (move_jit_frames)
    for cap in caps:
        mods = sorted(cap.modules, key=lambda m: m["lo"])
        los = np.array([m["lo"] for m in mods], np.uint64)
        shift = np.zeros(len(mods), np.int64)
        for i, m in enumerate(mods):
            key = module_key(m)
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
        renumber_python_frames(moved, cap.python_code, code)
        move_jit_frames(moved, inside, cap.jit_map.get("entries") or [], len(rows), jit)
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
    totals["wait_max_us"] = max((m.get("totals", {}).get("wait_max_us", 0) for m in metas),
                                default=0)  # a longest, not a sum
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
    checks = merged_leak_check(metas, rows)
    if checks:
        meta["leak_check"] = checks
    return Capture(meta, list(modules.values()), sites, np.array(offsets, np.uint64),
                   np.concatenate(frames) if frames else np.zeros(0, np.uint64),
                   complete=all(c.complete for c in caps), processes=caps, behaviour=behaviour,
                   python_code={n: c for c, n in code.items()},
                   jit_map={"name": "", "entries": jit, "cut": False} if jit else {},
                   by_process={"pid": np.array([m.get("pid") or 0 for m in metas], np.int64),
                               "stack_map": rows, **per})


MERGED_JIT_BASE = 1 << 61  # each process's JIT code moved to its own 2^48 bytes from here


def move_jit_frames(frames: np.ndarray, inside: np.ndarray, entries: list, p: int,
                    merged: list) -> None:
    """A process's frames in its JIT runtime's code (in no module, in its perf map) moved, with
    its map's entries, to a place of their own: two processes' JIT code may share addresses."""
    if not entries:
        return
    from .perf_map import JitMap  # (a JIT runtime's capture only)
    shift = MERGED_JIT_BASE + (p << 48)
    jit_map = JitMap(entries)
    for i in np.flatnonzero(~inside & ((frames >> np.uint64(63)) == 0)).tolist():
        if jit_map.at(int(frames[i])) is not None:
            frames[i] = np.uint64(int(frames[i]) + shift)
    merged += [[start + shift, size, name] for start, size, name in entries]


def renumber_python_frames(frames: np.ndarray, records: dict, merged: dict) -> None:
    """Python frames (record_format.h) name their process's code records: renumbered in place
    to the merged capture's, one number per code object alike in every process."""
    python = (frames & np.uint64(PYTHON_FRAME)) != 0
    if not python.any():
        return
    numbers = (frames[python] >> np.uint64(CODE_SHIFT)) & np.uint64(CODE_MASK)
    unique, where = np.unique(numbers, return_inverse=True)
    renumbered = np.array([merged.setdefault(records[n], len(merged) + 1) if n in records else 0
                           for n in unique.tolist()], np.uint64)
    new = renumbered[where]
    frames[python] = (frames[python] & ~np.uint64(CODE_MASK << CODE_SHIFT)) | (
        new << np.uint64(CODE_SHIFT))


def merged_leak_check(metas: list, rows: list) -> dict | None:
    """The processes' leak checks as one: each stack's categories summed under its merged id
    (the census's blocks, stack BEFORE_ATTACH, stay apart), the pause the longest, a check
    some process did not have said in the note."""
    from .._native import BEFORE_ATTACH
    checks = [(m.get("leak_check") or {}, ids, m.get("pid")) for m, ids in zip(metas, rows)]
    taken = [(c, ids) for c, ids, _ in checks if c.get("stacks") is not None]
    if not taken:
        return None
    summed: dict = {}
    for c, ids in taken:
        for row in c["stacks"]:
            stack = int(row[0])
            key = stack if stack == BEFORE_ATTACH else int(ids[stack]) if stack < len(ids) else 0
            into = summed.setdefault(key, [0] * (len(row) - 1))
            for i, v in enumerate(row[1:]):
                into[i] += int(v)
    out = {"stacks": [[k, *v] for k, v in sorted(summed.items())],
           "pause_ms": max(c.get("pause_ms", 0) for c, _ in taken),
           "threads": sum(c.get("threads", 0) for c, _ in taken),
           "bytes_read": sum(c.get("bytes_read", 0) for c, _ in taken),
           "heaps_known": all(c.get("heaps_known") for c, _ in taken)}
    if all(c.get("forked") for c, _ in taken):  # (each read from its copy: the scans after)
        out.update(forked=True, scan_ms=max(c.get("scan_ms", 0) for c, _ in taken),
                   fork_ms=max(c.get("fork_ms", 0) for c, _ in taken))
    groups: dict = {}  # the census's lost blocks, by category, size and type
    for c, _ in taken:
        for g in c.get("before_attach_lost") or ():
            into = groups.setdefault((g["category"], g["size"], g["type"]),
                                     dict(g, blocks=0, bytes=0))
            into["blocks"] += g["blocks"]
            into["bytes"] += g["bytes"]
    if groups:
        out["before_attach_lost"] = sorted(groups.values(), key=lambda g: -g["bytes"])
    whens = {c.get("when") for c, _ in taken if c.get("when")}
    if len(whens) == 1:
        out["when"] = whens.pop()
    missing = [f"PID {pid}: {c.get('skipped', 'no check')}" for c, _, pid in checks
               if c.get("stacks") is None]
    notes = [c["note"] for c, _ in taken if c.get("note")][:1] + (
        [f"not checked: {'; '.join(missing)}"] if missing else [])
    if notes:
        out["note"] = "; ".join(notes)
    return out
