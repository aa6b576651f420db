"""The program's own anonymous mappings (issue 33, point 4): mmap, munmap, mremap and
madvise(MADV_DONTNEED) hooked like allocations, in an accounting of their own, each mapping's
resident pages in the resident table under the call stack that mapped it."""
from __future__ import annotations

import re
import struct

from conftest import Memhook, build, run_memhook
from memhook.common.format import human_bytes

MiB = 1 << 20


def by_frames(rows: list, *names: str) -> dict:
    return next(r for r in rows if [f["function"] for f in r["frames"][:len(names)]] ==
                list(names))


def present_bytes(pid: int, ranges: list) -> int:
    """Bytes of the pages in RAM in [lo, hi) ranges of a process, as its pagemap says."""
    n = 0
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        for lo, hi in ranges:
            f.seek(lo // 4096 * 8)
            words = struct.unpack(f"<{(hi - lo) // 4096}Q", f.read((hi - lo) // 4096 * 8))
            n += sum(4096 for w in words if w >> 63)
    return n


def test_mappings_by_call_stack_to_the_byte(tmp_path, targets):
    """Mapped, cut at the tail and in the middle, released, moved by mremap: each stack's
    mapped, unmapped, released and still-mapped bytes are what the target did; the resident
    table holds each one's pages (as smaps counts them) under its stack; the stack is the call
    chain as gdb shows it; the heap's accounting sees none of it; a file mapping is not counted;
    unmapping what was mapped before attach is said, not subtracted from anything."""
    target = targets(build(tmp_path, "mappings.c"))
    mh = Memhook(target.pid, tmp_path)
    for command in ("map", "trim", "release", "hole", "grow", "file", "old"):
        target.command(command)
    report = mh.stop()
    m = report["mappings"]
    cache = by_frames(m["stacks"], "map_cache", "main")
    assert cache["frames"][0]["file"].endswith("mappings.c")
    assert (cache["maps"], cache["mapped_bytes"], cache["unmapped_bytes"],
            cache["released_bytes"]) == (1, 64 * MiB, 20 * MiB, 8 * MiB), cache
    assert cache["outstanding_bytes"] == 44 * MiB
    small = by_frames(m["stacks"], "map_cache", "map_small", "main")  # moved by the mremap
    assert (small["mapped_bytes"], small["unmapped_bytes"]) == (4 * MiB, 4 * MiB), small
    grown = by_frames(m["stacks"], "grow_small", "main")
    assert (grown["mapped_bytes"], grown["outstanding_bytes"]) == (12 * MiB, 12 * MiB), grown
    assert m["outstanding_bytes"] == 56 * MiB and m["mapped_bytes"] == 80 * MiB
    assert m["unknown_unmapped_bytes"] == 2 * MiB  # early_map's, from before attach
    assert report["totals"]["alloc_count"] == 0  # the heap's accounting saw none of it
    # Resident: map_cache's touched 32 MiB, less 8 MiB released and 4 MiB unmapped; grow's 12.
    # What memhook promises is the kernel's count of present pages in the ranges each stack
    # still maps, read from pagemap as the kernel reports them for the same ranges now (the
    # target waits): on one fresh machine the kernel had one page more than was touched.
    region = int(target.ask("where", "region").split()[1], 16)
    kernel = present_bytes(target.pid, [(region, region + 16 * MiB),
                                        (region + 20 * MiB, region + 48 * MiB)])
    assert 20 * MiB <= kernel <= 22 * MiB, kernel
    parts = {p["part"]: p for p in report["resident_memory"]["parts"]}
    assert parts["anonymous mmap by map_cache"]["rss_bytes"] == kernel
    assert parts["anonymous mmap by grow_small"]["rss_bytes"] == 12 * MiB
    text = run_memhook("report", mh.capture).stdout
    assert re.search(r"Anonymous mmap in this session .*: 56\.0 MiB still mapped of 80\.0 MiB "
                     r"mapped; 2\.0 MiB unmapped that was mapped before attach:", text), text
    assert "    44.0 MiB still mapped, 1 mapping of 64.0 MiB, 8.0 MiB released" in text, text
    assert re.search(rf"^\s+{human_bytes(kernel)}\s+{human_bytes(kernel)}\s+0 B  anonymous mmap "
                     r"by map_cache$", text, re.M), text
    assert target.finish() == 0


def test_resident_parts_in_every_view(tmp_path, targets):
    """The resident parts as each view shows them, with a mapping made after attach: the live
    view's lines (the mapping under the function that made it), the plot's lower axis (the
    parts stacked under RSS), and the HTML page's bar and table in headless Chromium."""
    import json
    import signal
    import subprocess

    from conftest import Lines, memhook_cmd
    from test_views import RAW_ADDRESS, open_in_chromium

    from memhook import capture
    from memhook.reporters import plots
    from memhook.symbolize import Symbolizer

    target = targets(build(tmp_path, "mappings.c"))
    cap = tmp_path / "parts.mh"
    mh = subprocess.Popen(memhook_cmd("-p", target.pid, "--interval", "0.5", "-o", cap),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    lines = Lines(mh.stdout)
    lines.expect("attached")
    target.command("map")
    live = [lines.expect("anonymous mmap by map_cache", timeout=30)]
    mh.send_signal(signal.SIGINT)
    mh.wait(60)
    assert mh.returncode == 0, mh.stderr.read()
    assert re.fullmatch(r"\s+32\.0 MiB  anonymous mmap by map_cache\n", live[0]), live
    report = json.loads(run_memhook("report", cap, "--format", "json").stdout)
    c = capture.read(str(cap))
    fig = plots.over_time(c, report, Symbolizer(c.modules))
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert {"anonymous mmap", "files (code, data)", "memhook", "resident (RSS)"} <= set(legend)
    last = report["timeseries"][-1]  # (the parts from smaps, RSS from status: read apart)
    assert last["rss_anonymous_bytes"] >= 32 * MiB and last["rss_file_bytes"] > 0, last
    assert abs(sum(last[k] for k in capture.PART_COLUMNS) - last["rss_bytes"]) < 4 * MiB, last
    page = tmp_path / "parts.html"
    assert run_memhook("report", cap, "--format", "html", "-o", page).returncode == 0
    dom = open_in_chromium(tmp_path, page)
    for heading in ("Resident memory", "Held before attach", "Anonymous mmap"):
        assert f"<h2>{heading}</h2>" in dom, heading
    bar = re.search(r'<div id="rss">(.*?)</div></div>', dom, re.S)
    assert bar and bar.group(1).count("width:") >= 3, dom[:2000]
    assert "anonymous mmap by map_cache" in dom
    assert not RAW_ADDRESS.search(re.sub(r"<script.*?</script>", "", dom, flags=re.S))
    assert target.finish() == 0
