"""`memhook leaks`'s text: the leak check alone, as LeakSanitizer's report reads. The check's
line (when, the pause, what was scanned), the lost blocks allocated while traced by stack
(definitely lost first, then what only lost blocks reach, then possibly lost), the census's
lost blocks by size and type, the suppressed apart; or why no check was taken."""
from __future__ import annotations

from ..common.format import frame_text, human_bytes, leak_site, one_line
from ..reachability import categories
from .text import leak_check_lines

FRAMES = 8
LOST = ("definitely_lost", "indirectly_lost", "possibly_lost")


def lost_sites(report: dict) -> list[dict]:
    """The sites holding lost blocks, the most definitely lost bytes first."""
    def key(s):
        return tuple(-s.get(c + "_bytes", 0) for c in LOST)
    return sorted((s for s in report["sites"] if any(s.get(c + "_count") for c in LOST)), key=key)


def render_leaks(report: dict, top: int = 10, full_names: bool = False) -> str:
    check = report.get("leak_check") or {}
    procs = report.get("processes")
    lines = [f"memhook leaks: {len(procs)} processes: " + ", ".join(
        f"PID {p['pid']} ({one_line(str(p['command']))})" for p in procs) if procs else
             f"memhook leaks: PID {report['pid']} ({one_line(str(report['command']))})"]
    if not check.get("totals"):
        lines.append("  no leak check: " + check.get("skipped", "none was taken"))
        return "\n".join(lines)
    lines += leak_check_lines(check, shown=top)
    sites = [s for s in lost_sites(report) if not s.get("suppressed_by")]
    before = check["before_attach"]
    lost = sum(categories.lost_bytes(s) for s in sites) + categories.lost_bytes(before)
    if not sites and not categories.lost_bytes(before):
        lines.append("No lost blocks: every block outstanding is reached from a root"
                     + (" (some only through interior pointers: possibly lost, above)"
                        if check["totals"]["possibly_lost_count"]
                        or before["possibly_lost_count"] else "") + ".")
    else:
        lines.append(f"Lost: {lost} bytes ({human_bytes(lost)})"
                     + (f"; {len(sites)} stacks allocated them while traced:" if sites
                        else ", all allocated before attach (no stacks: above)."))
    for n, s in enumerate(sites[:top], 1):
        lines.append(f"#{n} {categories.text(s)}: {leak_site(s, full_names=full_names)}")
        for f in s["frames"][:FRAMES]:
            lines.append(f"      {frame_text(f)}")
        if len(s["frames"]) > FRAMES:
            lines.append(f"      ... {len(s['frames']) - FRAMES} more frames")
    if len(sites) > top:
        lines.append(f"  ... {len(sites) - top} more stacks (--top, or --format json)")
    hidden = [s for s in lost_sites(report) if s.get("suppressed_by")]
    if hidden:
        lines.append(f"  ({len(hidden)} stacks with lost blocks suppressed, "
                     f"{sum(categories.lost_bytes(s) for s in hidden)} bytes lost: "
                     "--no-suppressions lists them)")
    return "\n".join(lines)


def render(cap, report: dict, symbolizer, top: int | None = None, full_names: bool = False,
           **_) -> str:
    return render_leaks(report, top=top or 10, full_names=full_names)
