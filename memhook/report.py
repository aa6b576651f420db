"""Reports: the JSON contract (README, "JSON report") and the human-readable text view."""
from __future__ import annotations

import os
from dataclasses import asdict

import numpy as np

from . import capture, elf, hooks
from .symbolize import Symbolizer

SITE_COLUMNS = ("alloc_count", "alloc_bytes", "free_count", "free_bytes",
                "outstanding_count", "outstanding_bytes", "op_mask")
TOTAL_KEYS = ("alloc_count", "alloc_bytes", "free_count", "free_bytes", "outstanding_count",
              "outstanding_bytes", "unknown_free_count", "dropped_events")


def capture_from_session(session, timeseries: dict) -> capture.Capture:
    consumer = session.consumer
    meta = session.metadata()
    meta["totals"] = {k: int(v) for k, v in consumer.totals().items()}
    arrays = {f"site_{k}": v for k, v in consumer.sites().items()}
    arrays["stack_offsets"], arrays["stack_frames"] = consumer.stacks()
    arrays.update({f"ts_{k}": np.asarray(v) for k, v in timeseries.items()})
    return capture.Capture(meta, [asdict(m) for m in session.modules.values()], arrays, True)


def build(cap: capture.Capture, *, min_size: int = 0, max_size: int | None = None,
          top: int | None = None, symbolizer: Symbolizer | None = None) -> dict:
    """The JSON report. Sites are sorted by outstanding bytes, largest first. The size filter
    keeps sites whose average allocation size lies in [min_size, max_size]."""
    a = cap.arrays
    if symbolizer is None:
        symbolizer = Symbolizer([elf.Module(**m) for m in cap.modules])
    offsets, frames = a["stack_offsets"], a["stack_frames"]
    count = a["site_alloc_count"]
    ids = np.nonzero(count)[0]
    ids = ids[ids > 0]
    avg = a["site_alloc_bytes"][ids] / np.maximum(count[ids], 1)
    keep = avg >= min_size
    if max_size is not None:
        keep &= avg <= max_size
    ids = ids[keep]
    order = np.lexsort((-a["site_alloc_bytes"][ids].astype(np.float64),
                        -a["site_outstanding_bytes"][ids].astype(np.float64)))
    ids = ids[order][:top] if top else ids[order]
    sites = []
    for i in ids:
        site = {k: int(a[f"site_{k}"][i]) for k in SITE_COLUMNS if k != "op_mask"}
        site["operations"] = hooks.operation_names(int(a["site_op_mask"][i]))
        site["frames"] = [symbolizer.frame(int(x)).as_dict()
                          for x in frames[int(offsets[i]):int(offsets[i + 1])]]
        sites.append(site)
    meta = cap.meta
    totals = meta.get("totals", {})
    return {
        "memhook_report": 1, "pid": meta.get("pid"), "command": meta.get("command"),
        "duration_s": meta.get("duration_s"),
        "totals": {k: int(totals.get(k, 0)) for k in TOTAL_KEYS},
        "sites": sites,
    }


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def frame_text(f: dict) -> str:
    where = f["function"] or (f"{os.path.basename(f['module'])}+0x{f['offset']:x}"
                              if f["module"] else f["address"])
    if f["file"]:
        return f"{where}  {f['file']}:{f['line']}"
    if f["module"]:
        return f"{where}  ({os.path.basename(f['module'])})"
    return where


def render_text(report: dict, top: int = 10, frames: int = 8) -> str:
    t = report["totals"]
    lines = [
        f"memhook report: PID {report['pid']} ({report['command']}), "
        f"{report['duration_s']} s traced",
        f"  allocated {t['alloc_count']} blocks, {human_bytes(t['alloc_bytes'])}; "
        f"freed {t['free_count']} blocks, {human_bytes(t['free_bytes'])}",
        f"  outstanding {t['outstanding_count']} blocks, {t['outstanding_bytes']} bytes "
        f"({human_bytes(t['outstanding_bytes'])})",
        f"  unknown frees (allocated before attach or filtered): {t['unknown_free_count']}; "
        f"dropped events: {t['dropped_events']}",
    ]
    leaking = [s for s in report["sites"] if s["outstanding_bytes"] > 0][:top]
    if not leaking:
        lines.append("No outstanding allocations.")
    else:
        lines.append(f"Top {len(leaking)} call stacks by outstanding bytes:")
    for n, s in enumerate(leaking, 1):
        lines.append(f"#{n} {s['outstanding_bytes']} bytes in {s['outstanding_count']} blocks "
                     f"({s['alloc_count']} allocated, {s['free_count']} freed) "
                     f"[{', '.join(s['operations'])}]")
        for f in s["frames"][:frames]:
            lines.append(f"      {frame_text(f)}")
        if len(s["frames"]) > frames:
            lines.append(f"      ... {len(s['frames']) - frames} more frames")
    return "\n".join(lines)
