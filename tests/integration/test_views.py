"""What a user reads, in every view of one capture: the live view, text, JSON, collapsed
stacks, the HTML page (its flame graph and plots, and in headless Chromium) and the plots
themselves name each frame the same way, and legends tell stacks apart."""
from __future__ import annotations

import html
import json
import re
import signal
import subprocess
import time

from conftest import Lines, build, flame_stacks, memhook_cmd, run_memhook, site

from memhook import capture as capture_mod
from memhook.common.format import distinct_labels, frame_name, frame_text
from memhook.common.format import leak_site as site_line_of
from memhook.reporters import plots
from memhook.symbolize import Symbolizer

RAW_ADDRESS = re.compile(r"0x[0-9a-f]{9,}")  # a runtime address: never where a name exists


def twins_session(tmp_path, targets):
    """lifecycle.c's twins (twin_leaf <- twin_mid <- twin_a / twin_b: two stacks that share
    their first two frames) and blocks freed at once, under memhook with the live view on,
    twice a second."""
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    cap = tmp_path / "twins.mh"
    mh = subprocess.Popen(memhook_cmd("-p", target.pid, "--interval", "0.5", "-o", cap),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    lines = Lines(mh.stdout)
    lines.expect("attached")
    for _ in range(3):
        target.command("twins")
        target.command("calls")  # blocks freed at once: the transient table
        time.sleep(0.6)
    live = []
    while not any("twin_leaf" in x for x in live):
        live.append(lines.expect("", timeout=10))
    mh.send_signal(signal.SIGINT)
    mh.wait(60)
    assert mh.returncode == 0, mh.stderr.read()
    report = json.loads(run_memhook("report", cap, "--format", "json").stdout)
    return cap, report, live


def test_one_name_per_frame_in_every_view(tmp_path, targets):
    cap, report, live = twins_session(tmp_path, targets)
    names = {frame_name(f) for s in report["sites"] for f in s["frames"]}
    a = site(report, "twin_a", 2)
    assert [frame_name(f) for f in a["frames"][:3]] == ["twin_leaf", "twin_mid", "twin_a"]

    # The live view: "  OUTSTANDING  GROWTH  FRAME  FILE:LINE  (via f0 <- f1)" (the leak's own
    # frame, then the runtime frames it called into), plain lines off a terminal.
    rows = [x for x in live if x.startswith("  ") and "/min" in x]
    assert rows, live
    for row in rows:
        where = re.split(r"\s{2,}", row.strip(), maxsplit=2)[2]
        assert where.split("  ")[0].removeprefix("(inlined) ") in names, (where, names)
        via = re.search(r"\(via (.*)\)$", where)
        assert not via or set(via.group(1).split(" <- ")) <= names, (where, names)
        assert not RAW_ADDRESS.search(row), row

    # Text: every frame line of every stack.
    text = run_memhook("report", cap).stdout
    # (the stacks' sections: after the tables of the process's memory)
    stacks = text[re.search(r"^(Leak suspects|Top \d+ call stacks)", text, re.M).start():]
    frame_lines = [x.strip() for x in stacks.splitlines() if x.startswith("      ")
                   and not x.strip().startswith("...")]
    assert frame_lines
    for x in frame_lines:
        assert x.split("  ")[0].removeprefix("(inlined) ") in names, x
    assert not RAW_ADDRESS.search(text)

    # Collapsed stacks.
    collapsed = run_memhook("report", cap, "--format", "collapsed").stdout
    for line in collapsed.splitlines():
        assert set(line.rsplit(" ", 1)[0].split(";")) <= names, line

    # HTML: the flame graph's frames, and no runtime address anywhere on the page.
    page = tmp_path / "report.html"
    assert run_memhook("report", cap, "--format", "html", "-o", page).returncode == 0
    html = page.read_text()
    flame = flame_stacks(html)
    assert {n for stack, *_ in flame for n in stack} <= names
    assert not RAW_ADDRESS.search(html)

    # Plots: the stacked plot's legend names each stack by what tells it from the others.
    c = capture_mod.read(str(cap))
    fig = plots.over_time(c, report, Symbolizer(c.modules))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    twins = [x for x in legend if x.startswith("twin_leaf")]
    assert sorted(twins) == ["twin_leaf ← … ← twin_a", "twin_leaf ← … ← twin_b"], legend
    for label in legend:
        if label not in ("other stacks", "anonymous resident memory"):
            assert set(label.replace("… ← ", "").split(" ← ")) <= names, label
    assert len(set(legend)) == len(legend), legend


def test_distinct_labels():
    """Labels: the call site; where stacks share it, the first frame where they part."""
    def stack(*fns):
        return [{"function": f, "module": "/x/lib.so", "offset": 16, "address": "0x10"}
                for f in fns]
    anon = [{"function": None, "module": "/x/lib.so", "offset": 0x2a, "address": "0x7f00002a"}]
    assert distinct_labels([stack("leaf", "mid", "a"), stack("leaf", "mid", "b"),
                            stack("other", "a"), stack("leaf2", "x"), stack("leaf2", "y"),
                            anon, stack("same"), stack("same")]) == [
        "leaf ← … ← a", "leaf ← … ← b", "other", "leaf2 ← x", "leaf2 ← y", "lib.so+0x2a",
        "same (stack 7)", "same (stack 8)"]
    # Alike from the leak's own frame up, told apart by the runtime function each called.
    libc = [{"function": "malloc", "module": "/lib/libc.so.6", "offset": 1, "address": "0x1"}]
    new = [{"function": "operator new(unsigned long)", "module": "/lib/libstdc++.so.6",
            "offset": 1, "address": "0x1"}]
    assert distinct_labels([libc + stack("keep", "main"), new + stack("keep", "main"),
                            new + stack("keep", "main"), stack("keep", "main")]) == [
        "keep (via malloc)", "keep (stack 2)", "keep (stack 3)", "keep"]


def test_html_page_in_headless_chromium(tmp_path, targets):
    """The page as a reader's browser shows it: every section there, the flame graph drawn by
    its script, no console error, no runtime address; the screenshot is kept for a person to
    look at (MEMHOOK_KEEP_SCREENSHOT=path)."""
    cap, report, _ = twins_session(tmp_path, targets)
    page = tmp_path / "report.html"
    assert run_memhook("report", cap, "--format", "html", "-o", page).returncode == 0
    dom = open_in_chromium(tmp_path, page)
    for heading in ("Leak suspects", "Over time", "Flame graph of outstanding bytes",
                    "Sizes and lifetimes", "Transient allocations (freed within 1 ms)"):
        assert f"<h2>{heading}</h2>" in dom, heading
    assert dom.count('style="left:') >= 4, "the flame graph was not drawn"
    assert "Click a frame to zoom in." in dom
    text = re.sub(r"<script.*?</script>", "", dom, flags=re.S)
    assert not RAW_ADDRESS.search(text)
    assert "transient share" not in text  # a table with headers, not a key dump
    assert re.search(r'<th class="num"[^>]*>share freed quickly</th>', dom)
    # The flame graph's search (the address can carry it): the frames holding the text
    # outlined, the bytes of their stacks summed; the weight toggle (blocks allocated); the
    # program's frames and the runtime's in different colours.
    searched = open_in_chromium(tmp_path, page, "#search=twin_leaf&weight=count")
    hits = re.findall(r'class="match" title="twin_leaf — (\d+) blocks', searched)
    total = sum(s["alloc_count"] for s in report["sites"]
                if any(f["function"] == "twin_leaf" for f in s["frames"]))
    assert hits and sum(map(int, hits)) == total, (hits, total)
    assert re.search(rf'Matching "twin_leaf": {total} blocks of \d+ blocks\.', searched)
    colours = {k: set(re.findall(rf'data-kind="{k}"[^>]*background: (rgb\([^)]*\))', searched))
               for k in "02"}
    assert colours["0"] and colours["2"] and not colours["0"] & colours["2"], colours
    # A sortable table, sorted on load by its first column (#sort=TABLE:COLUMN), largest first.
    by_count = open_in_chromium(tmp_path, page, "#sort=transient:0")
    table = re.search(r'<table class="sortable" id="transient" data-sorted="0 desc">(.*?)</table>',
                      by_count, re.S)
    assert table, "the transient table was not sorted"
    firsts = [float(v) for v in re.findall(r'<tr><td class="num" data-v="([\d.]+)"',
                                           table.group(1))]
    assert len(firsts) > 1 and firsts == sorted(firsts, reverse=True), firsts
    # Each table's stack: one line leading with the leak's own frame, its frames on a click.
    assert re.search(r'<details class="stack"><summary>twin_leaf  \S+lifecycle\.c:\d+</summary>'
                     r'<pre>twin_leaf  ', dom), dom[:2000]
    assert "<details class=\"stack\" open" not in dom  # (closed until clicked)
    # A click on the first transient row's stack (#expand=TABLE:ROW clicks its summary): that
    # stack opens, every frame in full, and only that one.
    clicked = open_in_chromium(tmp_path, page, "#expand=transient:1")
    table = re.search(r'<table class="sortable" id="transient">(.*?)</table>', clicked, re.S)
    opened = re.findall(r'<details class="stack" open="">(.*?)</details>', clicked, re.S)
    assert len(opened) == 1 and opened[0] in table.group(1), opened
    summary, pre = re.fullmatch(r"<summary>(.*?)</summary><pre>(.*)</pre>", opened[0],
                                re.S).groups()
    shown = [x for x in pre.splitlines() if x]
    first = report["transient"][0]  # (the table's rows in the report's order)
    assert html.unescape(summary) == site_line_of(first), summary
    assert [html.unescape(x) for x in shown] == [frame_text(f) for f in first["frames"]], shown


def open_in_chromium(tmp_path, page, fragment: str = "") -> str:
    """The page's DOM after its scripts ran in headless Chromium, once its screenshot was taken
    and no console error seen (MEMHOOK_KEEP_SCREENSHOT=path keeps the screenshot)."""
    import os
    import shutil
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "scripts/setup.sh installs chromium"
    flags = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
             "--window-size=1200,4000"]
    shot = tmp_path / "page.png"
    run = subprocess.run(flags + [f"--screenshot={shot}", page.as_uri() + fragment],
                         capture_output=True, text=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20000, run.stderr[-2000:]
    if os.environ.get("MEMHOOK_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["MEMHOOK_KEEP_SCREENSHOT"])
    console = [x for x in run.stderr.splitlines() if "CONSOLE" in x or "Uncaught" in x]
    assert not console, console
    return subprocess.run(flags + ["--dump-dom", page.as_uri() + fragment], capture_output=True,
                          text=True, timeout=120).stdout


def test_resident_memory_table_sums_to_rss(tmp_path, targets):
    """The report's "Resident memory" table (resident.py, read at detach): every part of the
    process's smaps, summing to its RSS as the kernel says it at that moment (the target idle),
    memhook's own segment and library a part of their own, the table in the text report."""
    from conftest import Memhook
    from memhook.common import resident
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    mh = Memhook(target.pid, tmp_path)
    target.command("go")
    time.sleep(0.5)  # (the target idle from here: its memory holds still)
    rss_attached = resident.totals(target.pid)["Rss"]
    report = mh.stop()
    assert target.finish() == 0
    res = report["resident_memory"]
    assert res["when"] == "detach"
    kinds = {p["kind"] for p in res["parts"]}
    assert {"heap", "stack", "memhook", "file"} <= kinds, res
    rss = sum(p["rss_bytes"] for p in res["parts"])
    # (the idle target's RSS, read by the test while attached: the same but for the pages
    # memhook's consumer or detach may touch)
    assert abs(rss - rss_attached) <= 64 << 10, (rss, rss_attached)
    text = run_memhook("report", mh.capture).stdout
    assert re.search(r"Resident memory at detach \(smaps: [0-9.]+ [KMG]iB resident", text), text
    assert "memhook (its segment and library)" in text and "malloc heap: live blocks (main arena)" in text
