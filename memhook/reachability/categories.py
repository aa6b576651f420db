"""The leak check's answer in a report's words: per stack, valgrind's four categories in bytes
and blocks (the fields every format carries), and the check's summary (how long the target was
stopped, what was scanned, why it was skipped). The capture keeps the check as taken
(check.py): rows of [stack, bytes and blocks per category]."""
from __future__ import annotations

from .. import _native

CATEGORIES = _native.LEAK_CATEGORIES  # definitely_lost, indirectly_lost, possibly_lost, reachable
FIELDS = tuple(f"{c}_{unit}" for c in CATEGORIES for unit in ("bytes", "count"))
ZERO = dict.fromkeys(FIELDS, 0)
WORDS = {"definitely_lost": "definitely lost", "indirectly_lost": "indirectly lost",
         "possibly_lost": "possibly lost", "reachable": "still reachable"}


def per_stack(meta: dict) -> dict | None:
    """stack id -> FIELDS, for the stacks the check saw; None when no check was taken (or it
    was skipped): then no site carries the fields."""
    rows = (meta.get("leak_check") or {}).get("stacks")
    if rows is None:
        return None
    return {int(r[0]): dict(zip(FIELDS, map(int, r[1:]))) for r in rows
            if int(r[0]) != _native.BEFORE_ATTACH}


def lost_bytes(fields: dict | None) -> int:
    """What LeakSanitizer would report: definitely and indirectly lost."""
    return fields["definitely_lost_bytes"] + fields["indirectly_lost_bytes"] if fields else 0


def summary(meta: dict) -> dict | None:
    """The check as a report shows it: totals per category over the session's stacks, the
    blocks from before attach apart, and how it was taken; or `skipped` and why."""
    lc = meta.get("leak_check")
    if not lc:
        return None
    out = {k: lc[k] for k in ("when", "pause_ms", "stop_ms", "drain_ms", "scan_ms", "threads",
                              "bytes_read", "unreadable_bytes", "root_bytes", "heaps_known",
                              "max_pause_ms", "skipped", "note", "before_attach_lost", "forked", "fork_ms", "reap_ms")
           if k in lc}
    rows = lc.get("stacks")
    if rows is not None:
        total, before = dict(ZERO), dict(ZERO)
        for r in rows:
            into = before if int(r[0]) == _native.BEFORE_ATTACH else total
            for k, v in zip(FIELDS, r[1:]):
                into[k] += int(v)
        out["totals"] = total
        out["before_attach"] = before
    return out


def text(fields: dict) -> str:
    """'4020 bytes in 4 blocks definitely lost; ...' for the categories with blocks."""
    return "; ".join(f"{fields[c + '_bytes']} bytes in {fields[c + '_count']} blocks {WORDS[c]}"
                     for c in CATEGORIES if fields.get(c + "_count"))
