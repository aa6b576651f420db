"""The session's peak (issue 34, point 3): the highest outstanding heap, kept by the consumer
without keeping events, with the stacks that held it then, beside the process's peak RSS."""
from __future__ import annotations

import re

from conftest import build, run_memhook, traced

MiB = 1 << 20


def test_peak_names_the_stack_that_held_it(tmp_path, targets):
    """100 MiB held by one stack, freed, then 1 MiB leaked elsewhere: the peak names that stack
    with exactly 100 MiB (the rest of the peak is what else was live then), the end 1 MiB."""
    mh, report = traced(targets(build(tmp_path, "peak.c")), tmp_path, "peak")
    peak = report["peak"]
    first = peak["stacks"][0]
    assert [f["function"] for f in first["frames"][:2]] == ["hold_big", "main"], first
    assert (first["peak_bytes"], first["outstanding_bytes"]) == (100 * MiB, 0)
    others = sum(r["peak_bytes"] for r in peak["stacks"][1:])
    assert peak["bytes"] == 100 * MiB + others and others < 64 << 10, peak
    assert not any(f["function"] == "leak_small" for r in peak["stacks"] for f in r["frames"])
    small = next(s for s in report["sites"] if s["frames"][0]["function"] == "leak_small")
    assert small["outstanding_bytes"] == MiB
    assert peak["vm_hwm_bytes"] >= 100 * 4096 and not peak["estimated"]
    assert 0 < peak["time_s"] < report["duration_s"]
    text = run_memhook("report", mh.capture).stdout
    assert re.search(r"^Peak: 100\.\d MiB outstanding, [\d.]+ s after attach; the process's "
                     r"peak RSS \(VmHWM\) [\d.]+ \w+; at that moment:\n  104857600 bytes "
                     r"\(100\.0 MiB\); 0 B at the end\n      hold_big  \S+peak\.c:\d+", text,
                     re.M), text
