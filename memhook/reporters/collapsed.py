"""Folded stacks (flamegraph.pl, inferno, speedscope)."""
from __future__ import annotations

from ..common.format import frame_name

WEIGHTS = {"outstanding": "outstanding_bytes", "allocated": "alloc_bytes", "count": "alloc_count"}


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


def render(cap, report: dict, symbolizer, weight: str = "outstanding", **_) -> str:
    return render_collapsed(report, weight)
