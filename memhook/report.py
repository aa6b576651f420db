"""Reports from a capture: the JSON contract (README, "JSON report"), text, folded stacks, and
the per-stack difference between two captures."""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

import numpy as np

from . import analysis, hooks
from .procfs import one_line
from .capture import MEMORY_COLUMNS, SERIES_COLUMNS, UNCERTAIN_COLUMNS, Capture
from .symbolize import Symbolizer

SITE_KEYS = ("alloc_count", "alloc_bytes", "free_count", "free_bytes", "outstanding_count",
             "outstanding_bytes")
TOTAL_KEYS = ("alloc_count", "alloc_bytes", "free_count", "free_bytes", "outstanding_count",
              "outstanding_bytes", "unknown_free_count", "dropped_events", "dropped_frees",
              "unordered_events", "sample_rate", "sampled_allocations", "reconciled_frees",
              "uncertain_count", "uncertain_bytes", "dropped_frees_unchecked")
WEIGHTS = {"outstanding": "outstanding_bytes", "allocated": "alloc_bytes", "count": "alloc_count"}


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
    if filters.max_size is not None:
        keep &= avg <= filters.max_size
    ids = ids[keep]
    order = np.lexsort((-s["alloc_bytes"][ids].astype(np.float64),
                        -s["outstanding_bytes"][ids].astype(np.float64)))
    return ids[order]


def site_frames(cap: Capture, stack: int, symbolizer: Symbolizer) -> list:
    return [f.as_dict() for addr in cap.frames(stack) for f in symbolizer.frames(int(addr))]


def build(cap: Capture, symbolizer: Symbolizer, filters: Filters | None = None) -> dict:
    """The JSON report: sites sorted by outstanding bytes, largest first."""
    filters = filters or Filters()
    candidates = _candidate_stacks(cap, filters)
    symbolizer.prepare(x for i in candidates for x in cap.frames(int(i)))
    sites = []
    progress = Progress("symbolizing call stacks", len(candidates))
    for i in candidates:
        progress.step()
        frames = site_frames(cap, int(i), symbolizer)
        if not filters.keep(frames):
            continue
        site = {k: int(cap.sites[k][i]) for k in SITE_KEYS + UNCERTAIN_COLUMNS}
        site["operations"] = hooks.operation_names(int(cap.sites["op_mask"][i]))
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
        "duration_s": meta.get("duration_s"),
        "totals": {k: int(totals.get(k, 0)) for k in TOTAL_KEYS},
        "sites": sites,
    }
    if cap.series and len(cap.series.get("time_s", [])):
        columns = [k for k in SERIES_COLUMNS + MEMORY_COLUMNS if k in cap.series]
        report["timeseries"] = [
            {k: (float(cap.series[k][j]) if k == "time_s" else int(cap.series[k][j]))
             for k in columns} for j in range(len(cap.series["time_s"]))]
        ranked = analysis.suspects(cap, filters.min_age_s)[:filters.suspects]
        symbolizer.prepare(x for r in ranked for x in cap.frames(r["stack"]))
        report["leak_suspects"] = [{**{k: v for k, v in r.items() if k != "stack"},
                                    **analysis.stack_histograms(cap, r["stack"]),
                                    "frames": site_frames(cap, r["stack"], symbolizer)}
                                   for r in ranked]
    if cap.behaviour is not None:
        for key, rows in (("transient", analysis.transient(cap, filters.transient_ns)),
                          ("thread_locality", analysis.thread_locality(cap))):
            symbolizer.prepare(x for r in rows for x in cap.frames(r["stack"]))
            report[key] = [{**{k: v for k, v in r.items() if k != "stack"},
                            "frames": site_frames(cap, r["stack"], symbolizer)} for r in rows]
        report["transient_threshold_ns"] = filters.transient_ns
        report["histograms"] = analysis.histograms(cap)
    if cap.processes:
        report["processes"], suspects = process_rows(cap, symbolizer, filters)
        report["leak_suspects"] = suspects[:filters.suspects]
    if analysis.process_memory(cap):
        report["process_memory"] = analysis.process_memory(cap)
    if symbolizer.problems:
        report["unsymbolized_modules"] = [{"module": m, "reason": why}
                                          for m, why in sorted(symbolizer.problems.items())]
    without = meta.get("unwind", {}).get("without_rows") or []
    if without:
        report["modules_without_unwind_rows"] = [{"module": m, "reason": why}
                                                 for m, why in without]
    if not cap.complete:
        report["incomplete"] = True
    return report


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
               "duration_s": meta.get("duration_s"), "end_reason": meta.get("end_reason"),
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


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def frame_name(f: dict) -> str:
    """A frame's one name, in every view: its function, else module+offset (what addr2line
    takes), else the bare address (code in no file, such as JIT code)."""
    if f["function"]:
        return f["function"]
    return f"{os.path.basename(f['module'])}+0x{f['offset']:x}" if f["module"] else f["address"]


def distinct_labels(stacks: list, width: int = 40) -> list[str]:
    """A label per stack (frames, call site first) that tells it from the others: its call
    site, and where another stack shares that, the first frame where the two part
    ("leaf ← … ← caller"). Stacks alike to the last name get their rank."""
    names = [[frame_name(f) for f in s] for s in stacks]

    def cut(name: str) -> str:
        return name if len(name) <= width else name[:width - 1] + "…"

    labels = []
    for i, s in enumerate(names):
        if not s:
            labels.append("[no frames]")
            continue
        shared = max((next((k for k, (a, b) in enumerate(zip(s, o)) if a != b), min(len(s), len(o)))
                      for j, o in enumerate(names) if j != i), default=0)
        if shared == 0:
            labels.append(cut(s[0]))
        elif shared < len(s):
            labels.append(f"{cut(s[0])} ← {'… ← ' if shared > 1 else ''}{cut(s[shared])}")
        else:
            labels.append(f"{cut(s[0])} (stack {i + 1})")
    return labels


def frame_text(f: dict) -> str:
    where = frame_name(f)
    if f.get("inlined"):
        where = "(inlined) " + where
    if f["file"]:
        return f"{where}  {f['file']}:{f['line']}"
    if f["module"]:
        return f"{where}  ({os.path.basename(f['module'])})"
    return where


def duration_text(ns: float) -> str:
    """A duration in the largest unit it fills, three significant digits."""
    for unit, scale in (("h", 3600e9), ("min", 60e9), ("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def process_memory_text(pm: dict) -> str:
    """The process's memory beside what this session saw allocated: the rest is not a leak
    finding, it is everything memhook did not see."""
    return (f"resident {human_bytes(pm['rss_bytes'])}, anonymous {human_bytes(pm['anon_bytes'])};"
            f" blocks allocated in this session and still live {human_bytes(pm['live_bytes'])};"
            f" anonymous memory not accounted for by them {human_bytes(max(pm['gap_bytes'], 0))}"
            " (blocks allocated before attach, the allocator's overhead and the free memory it"
            " keeps, memory not from malloc)" + (f" — {pm['note']}" if pm.get("note") else ""))


def dropped_frees_lines(t: dict) -> list[str]:
    """What became of the frees the hooks dropped (ring full): none is a leak unsaid."""
    if not t["dropped_frees"]:
        return []
    if t.get("dropped_frees_unchecked"):
        return [f"  {t['dropped_frees']} of the dropped events were frees, not checked (the "
                "target had exited, or the capture was cut off): up to that many blocks counted "
                "as outstanding may have been freed"]
    line = (f"  {t['dropped_frees']} of the dropped events were frees: the target's address "
            f"table showed {t['reconciled_frees']} outstanding blocks freed (no longer counted)")
    if t.get("uncertain_count"):
        return [line + ";", f"  uncertain: {t['uncertain_count']} outstanding blocks, "
                f"{human_bytes(t['uncertain_bytes'])}, may have been freed (their table entries "
                "were reused): marked per stack"]
    return [line + "; every other outstanding block is live"]


def render_text(report: dict, top: int = 10, frames: int = 8) -> str:
    t = report["totals"]
    procs = report.get("processes")
    who = (f"{len(procs)} processes" if procs
           else f"PID {report['pid']} ({one_line(str(report['command']))})")
    lines = [
        f"memhook report: {who}, {report['duration_s']} s traced"
        + (" [capture cut off]" if report.get("incomplete") else ""),
        f"  allocated {t['alloc_count']} blocks, {human_bytes(t['alloc_bytes'])}; "
        f"freed {t['free_count']} blocks, {human_bytes(t['free_bytes'])}",
        f"  outstanding {t['outstanding_count']} blocks, {t['outstanding_bytes']} bytes "
        f"({human_bytes(t['outstanding_bytes'])})",
        f"  unknown frees (allocated before attach or filtered): {t['unknown_free_count']}; "
        f"dropped events: {t['dropped_events']}",
    ]
    lines += dropped_frees_lines(t)
    if t.get("sample_rate"):
        lines.append(f"  sampled: one allocation per {human_bytes(t['sample_rate'])} on average "
                     f"({t['sampled_allocations']} samples); counts and bytes are estimates")
    pm = report.get("process_memory")
    if pm:
        lines.append("  process: " + process_memory_text(pm))
    for m in report.get("unsymbolized_modules", []):
        lines.append(f"  not symbolized: {m['module']}: {m['reason']}")
    for m in report.get("modules_without_unwind_rows", []):
        lines.append(f"  no unwind rows: {m['module']}: {m['reason']} (its frames are walked by "
                     "frame pointer; where it has none, stacks end there: [no unwind info])")
    if procs:
        lines.append("Processes (growing first):")
        for r in procs:
            first = r.get("top_suspect")
            where = next((frame_text(f) for f in first["frames"]), "?") if first else ""
            lines.append(f"  PID {r['pid']} ({one_line(str(r['command']))}): outstanding "
                         f"{human_bytes(r['outstanding_bytes'])} in {r['outstanding_count']} "
                         f"blocks; " + (f"growing {human_bytes(r['growth_bytes_per_min'])}/min"
                                        f", first at {where}" if r["growing"]
                                        else "not growing")
                         + (f" [{r['end_reason']}]" if r.get("end_reason") not in
                            (None, "", "interrupted", "duration reached", "terminated") else ""))
        lines.append("Merged view (stacks matched by build-id and offset across processes):")
    if report.get("leak_suspects"):
        lines.append("Leak suspects (growth at the end of the capture first):")
        for n, r in enumerate(report["leak_suspects"][:top], 1):
            where = next((frame_text(f) for f in r["frames"]), "?")
            lines.append(f"  {n}. " + (f"PID {r['pid']}: " if "pid" in r else "")
                         + f"{where}: {r['outstanding_bytes']} bytes; " + "; ".join(r["reasons"]))
    for r in report.get("transient", [])[:3]:
        where = next((frame_text(f) for f in r["frames"]), "?")
        lines.append(f"  transient: {where}: {r['transient_count']} of {r['alloc_count']} "
                     f"freed within {duration_text(report['transient_threshold_ns'])}"
                     + (f" ({r['unclassified_count']} more freed too quietly to time that "
                        "finely)" if r.get("unclassified_count") else "")
                     + f"; {r['temporary_share']:.0%} before the next allocation, "
                     f"{r['same_call_share']:.0%} by the call that allocated them")
    for r in report.get("thread_locality", [])[:3]:
        where = next((frame_text(f) for f in r["frames"]), "?")
        lines.append(f"  freed by another thread: {where}: {r['other_thread_share']:.0%} "
                     f"(same thread {r['same_thread_share']:.0%}, live {r['live_share']:.0%})")
    leaking = [s for s in report["sites"] if s["outstanding_bytes"] > 0][:top]
    lines.append(f"Top {len(leaking)} call stacks by outstanding bytes:" if leaking
                 else "No outstanding allocations.")
    for n, s in enumerate(leaking, 1):
        lines.append(f"#{n} {s['outstanding_bytes']} bytes in {s['outstanding_count']} blocks "
                     f"({s['alloc_count']} allocated, {s['free_count']} freed) "
                     f"[{', '.join(s['operations'])}]"
                     + (f"; uncertain: {s['uncertain_bytes']} bytes in {s['uncertain_count']} "
                        "blocks may have been freed" if s.get("uncertain_count") else ""))
        if s.get("processes"):
            lines.append("      in " + ", ".join(f"PID {p['pid']}: {p['outstanding_bytes']} bytes"
                                                 for p in s["processes"]))
        for f in s["frames"][:frames]:
            lines.append(f"      {frame_text(f)}")
        if len(s["frames"]) > frames:
            lines.append(f"      ... {len(s['frames']) - frames} more frames")
    return "\n".join(lines)


def _fold_name(f: dict) -> str:
    return frame_name(f).replace(";", ":").replace("\n", " ")


def render_collapsed(report: dict, weight: str = "outstanding") -> str:
    """Folded stacks (flamegraph.pl, inferno, speedscope): root first, `;`-separated, then a
    space and the weight. Stacks of equal text are summed."""
    key = WEIGHTS[weight]
    folded: dict = {}
    for s in report["sites"]:
        if s[key] <= 0:
            continue
        line = ";".join(_fold_name(f) for f in reversed(s["frames"])) or "[unknown]"
        folded[line] = folded.get(line, 0) + s[key]
    return "\n".join(f"{k} {v}" for k, v in sorted(folded.items(), key=lambda kv: -kv[1]))


def stack_key(frames: list, build_ids: dict) -> tuple:
    """A stack's identity across processes and hosts: module (by build-id where it has one)
    and ELF offset per frame; absolute addresses move with ASLR."""
    return tuple((build_ids.get(f["module"]) or f["module"], f["offset"], bool(f.get("inlined")))
                 if f["module"] else (None, f["address"], False) for f in frames)


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


def render_diff_text(d: dict, top: int = 10, frames: int = 6) -> str:
    lines = [f"memhook diff: PID {d['base']['pid']} -> PID {d['other']['pid']}: outstanding "
             f"{d['change_bytes']:+d} bytes"]
    for n, r in enumerate(d["sites"][:top], 1):
        lines.append(f"#{n} {r['change_bytes']:+d} bytes ({r['outstanding_bytes_before']} -> "
                     f"{r['outstanding_bytes_after']}), {r['outstanding_count_change']:+d} blocks")
        for f in r["frames"][:frames]:
            lines.append(f"      {frame_text(f)}")
    return "\n".join(lines)
