"""The report every format renders: the JSON contract (README, "JSON report"), built from a
capture and its symbols, with the analyses' findings; and the per-stack difference between two
captures."""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass

import numpy as np

from ..common import attribution
from ..elf import hooks
from ..reachability import categories
from . import analysis
from ..capture import (MEMORY_COLUMNS, PART_COLUMNS, SERIES_COLUMNS, UNCERTAIN_COLUMNS, Capture,
                       stack_key)
from ..capture import snapshots
from ..symbolize import Symbolizer, stack_frames

SITE_KEYS = ("alloc_count", "alloc_bytes", "free_count", "free_bytes", "outstanding_count",
             "outstanding_bytes")
# The four sample types of a heap profile, in Go's order (pprof's default, the last, is in-use
# space): (name, unit, the site's key).
SAMPLE_TYPES = (("alloc_objects", "count", "alloc_count"), ("alloc_space", "bytes", "alloc_bytes"),
                ("inuse_objects", "count", "outstanding_count"),
                ("inuse_space", "bytes", "outstanding_bytes"))


def lost_sample_type(report: dict) -> tuple:
    """With the leak check (reachability/), one sample type more: the bytes no pointer reaches,
    the leaks themselves."""
    return ((("definitely_lost_space", "bytes", "definitely_lost_bytes"),)
            if (report.get("leak_check") or {}).get("totals") else ())


TOTAL_KEYS = ("alloc_count", "alloc_bytes", "free_count", "free_bytes", "outstanding_count",
              "outstanding_bytes", "unknown_free_count", "dropped_events", "dropped_frees",
              "unordered_events", "sample_rate", "sampled_allocations", "reconciled_frees",
              "uncertain_count", "uncertain_bytes", "dropped_frees_unchecked", "peak_bytes",
              "peak_time_ms", "waited_events", "wait_ns", "wait_timeouts", "wait_max_us")


@dataclass
class Filters:
    min_size: int = 0            # on a site's average allocation size
    max_size: int | None = None
    module: str | None = None    # substring of any frame's module path
    function: str | None = None  # regex searched in any frame's function name
    top: int | None = None
    min_age_s: float = 60.0      # leak suspects: a live block this old counts as old
    suspects: int = 10           # leak suspects listed
    transient_ns: float = 1e6    # transient allocations: freed within this many ns
    runtime: attribution.Rules = attribution.DEFAULT  # what is not the leak's own frame
    # Only the stacks still holding bytes: all the text report lists (and all suppressions and
    # --fail-on-leak weigh). A Python program's import made 349,000 stacks, all but 20,000 of
    # them freed everything; naming each one's frames was 9 of the report's 20 s.
    outstanding_only: bool = False

    def __post_init__(self):
        try:
            self._fn = re.compile(self.function) if self.function else None
        except re.error as e:
            raise ValueError(f"invalid --function pattern: {e}") from None

    def keep(self, frames: list) -> bool:
        if self.module and not any(self.module in (f["module"] or "") for f in frames):
            return False
        if self._fn and not any(self._fn.search(f["function"] or "") for f in frames):
            return False
        return True


class Progress:
    """A percentage on standard error for long jobs, when it is a terminal."""

    def __init__(self, what: str, total: int, minimum: int = 2000):
        self.what, self.total, self.n, self.shown = what, total, 0, -1
        self.on = total >= minimum and sys.stderr.isatty()

    def step(self) -> None:
        self.n += 1
        pct = 100 * self.n // max(self.total, 1)
        if self.on and pct != self.shown:
            self.shown = pct
            print(f"\rmemhook: {self.what}: {pct}%", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.on:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def _candidate_stacks(cap: Capture, filters: Filters) -> np.ndarray:
    s = cap.sites
    ids = np.nonzero(s["alloc_count"])[0]
    ids = ids[ids > 0]
    avg = s["alloc_bytes"][ids] / np.maximum(s["alloc_count"][ids], 1)
    keep = avg >= filters.min_size
    if filters.outstanding_only:
        keep &= s["outstanding_bytes"][ids] > 0
    if filters.max_size is not None:
        keep &= avg <= filters.max_size
    ids = ids[keep]
    order = np.lexsort((-s["alloc_bytes"][ids].astype(np.float64),
                        -s["outstanding_bytes"][ids].astype(np.float64)))
    return ids[order]


def site_frames(cap: Capture, stack: int, symbolizer: Symbolizer) -> list:
    return stack_frames(symbolizer, cap.frames(stack))


PEAK_STACKS = 10


def peak_rows(cap: Capture, symbolizer: Symbolizer, filters: "Filters") -> dict | None:
    """The session's highest outstanding heap (exact in full tracing, estimated in sampling
    mode), when, and the stacks holding most of it then, beside the process's peak RSS."""
    totals = cap.meta.get("totals", {})
    col = cap.sites.get("peak_bytes")
    if not totals.get("peak_bytes") or col is None:
        return None
    order = [int(i) for i in np.argsort(-col.astype(np.float64)) if col[i]][:PEAK_STACKS]
    symbolizer.prepare(x for i in order for x in cap.frames(i))
    stacks = []
    for i in order:
        frames = site_frames(cap, i, symbolizer)
        if filters.keep(frames):
            stacks.append({"peak_bytes": int(col[i]),
                           "outstanding_bytes": int(cap.sites["outstanding_bytes"][i]),
                           "frames": frames})
    return {"bytes": int(totals["peak_bytes"]), "time_s": totals.get("peak_time_ms", 0) / 1000,
            "estimated": bool(totals.get("sample_rate")),
            "vm_hwm_bytes": int(cap.meta.get("vm_hwm_bytes", 0)), "stacks": stacks}


def growing_types(census: dict) -> list:
    """C++ types with more live blocks at detach than at attach (heap census): suspects among
    the blocks memhook could not see allocated, largest growth first."""
    at, end = census.get("attach") or {}, census.get("detach") or {}
    if not at.get("by_type") or not end.get("by_type"):
        return []
    before = {t["type"]: t for t in at["by_type"]}
    rows = []
    for t in end["by_type"]:
        b = before.get(t["type"], {"blocks": 0, "bytes": 0})
        if t["blocks"] > b["blocks"]:
            rows.append({"type": t["type"], "module": t["module"],
                         "attach_blocks": b["blocks"], "detach_blocks": t["blocks"],
                         "grown_blocks": t["blocks"] - b["blocks"],
                         "grown_bytes": t["bytes"] - b["bytes"]})
    return sorted(rows, key=lambda r: -r["grown_bytes"])


def _first_name(frames: list) -> str:
    return next((f["function"] for f in frames if f.get("function")), "?")


def _named_part(part: dict, cap: Capture, symbolizer: Symbolizer) -> dict:
    """A resident part mapped by a call stack (resident.split_by_mappings): named by its first
    frame, its frames beside."""
    if not part.get("stack"):
        return part
    frames = site_frames(cap, int(part["stack"]), symbolizer)
    return {**part, "part": f"anonymous mmap by {_first_name(frames)}", "frames": frames}


def mapping_rows(mappings: dict, cap: Capture, symbolizer: Symbolizer) -> dict:
    """The program's anonymous mappings in the session (mmap, munmap, mremap, madvise hooks),
    by call stack, still mapped first."""
    rows = []
    for m in mappings["stacks"]:
        rows.append({**{k: v for k, v in m.items() if k != "stack"},
                     "outstanding_bytes": m["mapped_bytes"] - m["unmapped_bytes"],
                     "frames": site_frames(cap, int(m["stack"]), symbolizer)})
    rows.sort(key=lambda r: (-r["outstanding_bytes"], -r["mapped_bytes"]))
    return {"outstanding_bytes": sum(r["outstanding_bytes"] for r in rows),
            "mapped_bytes": sum(r["mapped_bytes"] for r in rows),
            "unknown_unmapped_bytes": mappings.get("unknown_unmapped_bytes", 0),
            "stacks": rows}


def build(cap: Capture, symbolizer: Symbolizer, filters: Filters | None = None) -> dict:
    """The JSON report: sites sorted by outstanding bytes, largest first."""
    filters = filters or Filters()
    symbolizer.use(cap)
    candidates = _candidate_stacks(cap, filters)
    symbolizer.prepare(np.concatenate([cap.frames(int(i)) for i in candidates] or [[]]))
    sites = []
    progress = Progress("symbolizing call stacks", len(candidates))
    # Each column as a list once (an int() of a numpy element per key and stack: 10,000 stacks
    # took 0.05 s).
    keys = SITE_KEYS + UNCERTAIN_COLUMNS + (("peak_bytes",) if "peak_bytes" in cap.sites else ())
    columns = [(k, cap.sites[k].tolist()) for k in keys]
    op_masks = cap.sites["op_mask"].tolist()
    leaks = categories.per_stack(cap.meta)  # the leak check at detach, if one was taken
    for i in candidates:
        progress.step()
        i = int(i)
        frames = site_frames(cap, i, symbolizer)
        if not filters.keep(frames):
            continue
        site = {k: column[i] for k, column in columns}
        site["operations"] = hooks.operation_names(op_masks[i])
        if leaks is not None:
            site.update(leaks.get(i, categories.ZERO))
        site["frames"] = frames
        if cap.by_process is not None:
            bp = cap.by_process
            site["processes"] = [{"pid": int(pid), "outstanding_bytes": int(b[i]),
                                  "outstanding_count": int(c[i])}
                                 for pid, b, c in zip(bp["pid"], bp["outstanding_bytes"],
                                                      bp["outstanding_count"]) if c[i] or b[i]]
        sites.append(site)
        if filters.top and len(sites) >= filters.top:
            break
    progress.done()
    meta = cap.meta
    # Captures from before the reconciliation checked no dropped free.
    totals = {"dropped_frees_unchecked": meta.get("totals", {}).get("dropped_frees", 0),
              **meta.get("totals", {})}
    report = {
        "memhook_report": 1, "pid": meta.get("pid"), "command": meta.get("command"),
        "libc": meta.get("libc") or "",
        "duration_s": meta.get("duration_s"),
        # why tracing ended: Ctrl-C, --duration, "program exited with code 3" (memhook run)...
        "end_reason": meta.get("end_reason") or "",
        # the target unhooked itself before the end (memhook's heartbeat looked stale to it):
        # what it did after that was not traced
        "abandoned": bool(meta.get("abandoned")),
        "totals": {k: int(totals.get(k, 0)) for k in TOTAL_KEYS},
        "sites": sites,
        # allocation functions beside libc's, and whether their calls were traced (allocators.py)
        "allocators": [a for a in meta.get("allocators", []) if isinstance(a, dict)],
    }
    if isinstance(meta.get("python"), dict):  # a CPython, and whether its frames were read
        report["python"] = meta["python"]
    if isinstance(meta.get("jit"), dict):  # a JIT runtime, and what its perf map named
        report["jit"] = meta["jit"]
    check = categories.summary(meta)
    if check:
        report["leak_check"] = check
    if cap.series and len(cap.series.get("time_s", [])):
        columns = [k for k in SERIES_COLUMNS + MEMORY_COLUMNS + PART_COLUMNS if k in cap.series]
        report["timeseries"] = [
            {k: (float(cap.series[k][j]) if k == "time_s" else int(cap.series[k][j]))
             for k in columns} for j in range(len(cap.series["time_s"]))]
        churn: list = []
        everything = analysis.suspects(cap, filters.min_age_s, churn)
        ranked = everything[:filters.suspects]
        unsaid = analysis.left_out(cap, everything, filters.suspects, churn)
        symbolizer.prepare(x for r in ranked + unsaid for x in cap.frames(r["stack"]))
        report["leak_suspects"] = [{**{k: v for k, v in r.items() if k != "stack"},
                                    **analysis.stack_histograms(cap, r["stack"]),
                                    "frames": site_frames(cap, r["stack"], symbolizer)}
                                   for r in ranked]
        if unsaid:  # (a stack holding a tenth of the bytes is never left out unsaid)
            report["not_suspects"] = [{**{k: v for k, v in r.items() if k != "stack"},
                                       "frames": site_frames(cap, r["stack"], symbolizer)}
                                      for r in unsaid]
    if cap.behaviour is not None:
        for key, rows in (("transient", analysis.transient(cap, filters.transient_ns)),
                          ("thread_locality", analysis.thread_locality(cap))):
            symbolizer.prepare(x for r in rows for x in cap.frames(r["stack"]))
            report[key] = [{**{k: v for k, v in r.items() if k != "stack"},
                            "frames": site_frames(cap, r["stack"], symbolizer)} for r in rows]
        report["transient_threshold_ns"] = filters.transient_ns
        report["histograms"] = analysis.histograms(cap)
    if snapshots.numbers(cap):  # (memhook report FILE --snapshot N reports on one)
        report["snapshots"] = snapshots.listing(cap)
    if cap.processes:
        report["processes"], suspects = process_rows(cap, symbolizer, filters)
        report["leak_suspects"] = suspects[:filters.suspects]
    if analysis.process_memory(cap):
        report["process_memory"] = analysis.process_memory(cap)
    # The process's resident memory in parts (resident.py): at detach, else at attach.
    res = meta.get("resident") or {}
    when = "detach" if res.get("detach") else "attach" if res.get("attach") else ""
    if when:
        report["resident_memory"] = {"when": when,
                                     "parts": [_named_part(p, cap, symbolizer) for p in res[when]]}
    stats = {when: s for when, s in (meta.get("allocator_stats") or {}).items() if s}
    if stats:
        report["allocator_stats"] = stats
    mappings = meta.get("mappings") or {}
    if mappings.get("stacks"):
        report["mappings"] = mapping_rows(mappings, cap, symbolizer)
    peak = peak_rows(cap, symbolizer, filters)
    if peak:
        report["peak"] = peak
    # The heap census (heap_census.py): the heap before attach, and at detach.
    census = {when: c for when, c in (meta.get("heap_census") or {}).items() if c}
    if census:
        report["heap_census"] = census
        for c in census.values():  # the blocks holding a heap's top, allocated in the session
            for a in c.get("arenas", []):
                for h in a["heaps"]:
                    pin = h.get("top_pinned_by")
                    if pin and pin.get("stack"):
                        pin["frames"] = site_frames(cap, int(pin["stack"]), symbolizer)
        grew = growing_types(census)
        if grew:
            census["growing_types"] = grew
    if symbolizer.problems:
        report["unsymbolized_modules"] = [{"module": m, "reason": why}
                                          for m, why in sorted(symbolizer.problems.items())]
    without = meta.get("unwind", {}).get("without_rows") or []
    if without:
        report["modules_without_unwind_rows"] = [{"module": m, "reason": why}
                                                 for m, why in without]
    derived = meta.get("unwind", {}).get("derived") or []
    if derived:  # (their frames carry "unwound": "derived rows": symbolize/derived_rows)
        report["modules_with_derived_rows"] = [{"module": m, "functions": n}
                                               for m, n, _ in derived]
    if not cap.complete:
        report["incomplete"] = True
    attribute(report, filters.runtime)
    return report


def attribute(report: dict, rules: attribution.Rules) -> None:
    """Every stack of the report gets `attributed_frame`: the index of its frame a person would
    fix (attribution.py); every frame stays."""
    def walk(node):
        if isinstance(node, dict):
            frames = node.get("frames")
            if isinstance(frames, list) and frames and isinstance(frames[0], dict):
                node["attributed_frame"] = attribution.attributed(frames, rules)
            for k, v in node.items():  # (frames hold no stacks; numbers and strings none)
                if k != "frames" and isinstance(v, (dict, list)):
                    walk(v)
        elif isinstance(node, list) and node and isinstance(node[0], (dict, list)):
            for v in node:  # (not lists of numbers: histograms, series)
                walk(v)
    # The sites first, directly: each holds one stack and no other (a Python program's 349,000
    # sites' keys were most of the walk).
    sites = report.get("sites")
    if isinstance(sites, list) and all(isinstance(s, dict) and "frames" in s for s in sites):
        for site in sites:
            if site["frames"]:
                site["attributed_frame"] = attribution.attributed(site["frames"], rules)
        report = {k: v for k, v in report.items() if k != "sites"}
    walk(report)


def render(cap: Capture, report: dict, symbolizer: Symbolizer, **_) -> str:
    """The JSON report: one line, for jq and programs. (Indented, the encoder is Python's own,
    not C's: a 90,000-stack report of a gunicorn master took 2 minutes and 17 GB; one line,
    a few seconds.)"""
    return json.dumps(report, separators=(",", ":"))


def process_rows(cap: Capture, symbolizer: Symbolizer, filters: Filters) -> tuple[list, list]:
    """A merged capture's processes, growing ones first: each one's totals, how fast its leak
    suspects grow at the end of its capture, and its first suspect; and every process's leak
    suspects in one ranking, each with its PID (frames from the merged view: the same stacks
    there)."""
    rows, suspects = [], []
    for proc, stack_map in zip(cap.processes, cap.by_process["stack_map"]):
        meta, t = proc.meta, proc.meta.get("totals", {})
        ranked = analysis.suspects(proc, filters.min_age_s) if proc.series else []
        ranked = ranked[:filters.suspects]
        for r in ranked:
            merged = int(stack_map[r["stack"]])
            suspects.append({"pid": meta.get("pid"),
                             **{k: v for k, v in r.items() if k != "stack"},
                             **analysis.stack_histograms(proc, r["stack"]),
                             "frames": site_frames(cap, merged, symbolizer)})
        growing = [r for r in ranked if r["score"] > 0]
        row = {"pid": meta.get("pid"), "command": meta.get("command"),
               "libc": meta.get("libc") or "", "duration_s": meta.get("duration_s"),
               "end_reason": meta.get("end_reason"),
               **{k: int(t.get(k, 0)) for k in ("alloc_count", "alloc_bytes",
                                                 "outstanding_count", "outstanding_bytes",
                                                 "dropped_events")},
               "growing": bool(growing),
               "growth_bytes_per_min": round(sum(r["late_growth_bytes_per_min"]
                                                 for r in growing), 1)}
        first = (growing or ranked or [None])[0]
        if first is not None:
            merged = int(stack_map[first["stack"]])
            row["top_suspect"] = {"outstanding_bytes": first["outstanding_bytes"],
                                  "reasons": first["reasons"],
                                  "frames": site_frames(cap, merged, symbolizer)}
        rows.append(row)
    rows.sort(key=lambda r: (-r["growth_bytes_per_min"], -r["outstanding_bytes"]))
    suspects.sort(key=lambda r: (-r["score"], -r["outstanding_bytes"]))
    return rows, suspects


def diff(base: dict, other: dict, base_cap: Capture, other_cap: Capture) -> dict:
    """Per-stack change from `base` to `other` in outstanding bytes and blocks, largest change
    first; a stack found in one report only counts as zero in the other."""
    index: dict = {}
    for which, rep, cap in ((0, base, base_cap), (1, other, other_cap)):
        ids = {m["path"]: m.get("build_id") for m in cap.modules}
        for s in rep["sites"]:
            entry = index.setdefault(stack_key(s["frames"], ids), [None, None])
            entry[which] = s
    rows = []
    for a, b in index.values():
        before = a["outstanding_bytes"] if a else 0
        after = b["outstanding_bytes"] if b else 0
        if before == after:
            continue
        rows.append({"outstanding_bytes_before": before, "outstanding_bytes_after": after,
                     "change_bytes": after - before,
                     "outstanding_count_change": (b["outstanding_count"] if b else 0)
                     - (a["outstanding_count"] if a else 0),
                     "frames": (b or a)["frames"]})
    rows.sort(key=lambda r: -abs(r["change_bytes"]))
    return {"memhook_diff": 1, "base": {"pid": base["pid"], "command": base["command"]},
            "other": {"pid": other["pid"], "command": other["command"]},
            "change_bytes": other["totals"]["outstanding_bytes"]
            - base["totals"]["outstanding_bytes"], "sites": rows}


