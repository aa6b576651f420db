"""The session's peak (issue 34, point 3): the highest outstanding heap, kept by the consumer
without keeping events, with the stacks that held it then, beside the process's peak RSS."""
from __future__ import annotations

import re

import os
import shutil
import subprocess

import pytest

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
                     r"\(100\.0 MiB\); 0 B at the end: hold_big  \S+peak\.c:\d+\n"
                     r"      hold_big  \S+peak\.c:\d+", text,
                     re.M), text


def test_peak_flame_graph_and_pprof_sample_type(tmp_path, targets):
    """The HTML page draws the peak's own flame graph (headless Chromium), hold_big as wide as
    the peak; pprof has a peak_space sample type that go tool pprof reads."""
    from test_views import open_in_chromium
    mh, report = traced(targets(build(tmp_path, "peak.c")), tmp_path, "peak")
    page = tmp_path / "peak.html"
    assert run_memhook("report", mh.capture, "--format", "html", "-o", page).returncode == 0
    dom = open_in_chromium(tmp_path, page)
    assert "<h2>Flame graph at the peak</h2>" in dom
    peak_box = re.search(r'<div id="peak-flame"[^>]*>(.*?)</div></div>', dom, re.S)
    assert peak_box and re.search(r'title="hold_big — 100\.0 MiB \(the program\)"',
                                  peak_box.group(0)), dom[-3000:]
    if shutil.which("go") is None:
        pytest.skip("Go is not installed: the pprof half needs go tool pprof")
    prof = tmp_path / "heap.pb.gz"
    assert run_memhook("report", mh.capture, "--format", "pprof", "-o", prof).returncode == 0
    env = dict(os.environ, HOME=str(tmp_path), PPROF_TMPDIR=str(tmp_path))
    top = subprocess.run(["go", "tool", "pprof", "-top", "-sample_index=peak_space", str(prof)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert top.returncode == 0, top.stderr
    line = next(x for x in top.stdout.splitlines() if x.endswith(" hold_big"))
    assert line.split()[0] == "100MB", line
