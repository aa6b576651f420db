"""Leak analysis on targets of known shape."""
import shutil
import subprocess
import time

import pytest

from conftest import (ITERS, TARGETS, WORKERS, Lines, Memhook, build, flame_stacks,
                      report_json, run_memhook)


@pytest.mark.serial  # timing: measured with no other test beside it
def test_steady_leak_ranks_above_plateau_and_startup_data(tmp_path, targets):
    """shapes.c: the slow leak ranks first and says it keeps accumulating; the cache that filled
    is plateaued; start-up data is held; per-request memory, freed every 100 ms however high it
    is when the capture ends, is not a suspect."""
    target = targets(build(tmp_path, "shapes.c"))
    mh = Memhook(target.pid, tmp_path, "--interval", "0.1")
    time.sleep(0.3)  # samples before "run": the start-up data arrives after attach
    target.command("run")
    time.sleep(0.5)
    mh.stop()
    rep = report_json(mh.capture, "--min-age", "1")
    by_function = {r["frames"][0]["function"]: r for r in rep["leak_suspects"]}
    steady, cache, startup = (by_function[f] for f in ("steady_leak", "cache_fill",
                                                         "startup_data"))
    assert rep["leak_suspects"][0] is steady
    assert steady["outstanding_bytes"] == 300 * 100
    nominal = 100 / 0.010 * 60  # 100 B every 10 ms, in B/min (sleeps make it a little less)
    assert 0.7 * nominal < steady["growth_bytes_per_min"] < 1.1 * nominal
    assert steady["late_growth_bytes_per_min"] > 0.2 * nominal  # the flat tail is in the window
    assert steady["score"] > 0 and steady["never_freed_share"] == 1.0
    assert cache["outstanding_bytes"] == 80 * 1024 and cache["late_growth_bytes_per_min"] == 0
    assert cache["score"] == 0 and startup["score"] == 0
    assert startup["outstanding_bytes"] == 200000 and startup["old_share"] == 1.0
    # Proven first (the leak check at detach: steady_leak keeps no pointer; a few stale copies
    # on the stack or in registers may still reach the latest blocks, as they would valgrind),
    # then how it grew.
    assert steady["definitely_lost_bytes"] >= 250 * 100
    assert steady["reasons"][0].endswith("definitely lost (no pointer reaches them)")
    assert steady["reasons"][1].startswith("live blocks of this stack keep accumulating: ")
    assert cache["plateaued"] and "then plateaued" in cache["reasons"][0]
    assert "request_memory" not in by_function
    requests = next(s for s in rep["sites"] if s["frames"][0]["function"] == "request_memory")
    assert requests["outstanding_bytes"] == 5 * 4096  # outstanding at the end, all the same
    assert steady["size_log2"][6] == 300 and sum(steady["size_log2"]) == 300  # 100 B: [64, 128)
    assert sum(steady["age_ns_log2"]) == 300 and sum(steady["lifetime_ns_log2"]) == 0
    # Larger but flat: listed after the leak, by size.
    assert [r["frames"][0]["function"] for r in rep["leak_suspects"][1:3]] == \
        ["startup_data", "cache_fill"]
    rows = rep["timeseries"]
    assert all(r["rss_bytes"] > 0 and r["anon_bytes"] > 0 for r in rows)
    assert rows[-1]["heap_bytes"] >= 200000 or rows[-1]["anon_bytes"] >= 200000
    pm = rep["process_memory"]
    assert pm["live_bytes"] == rep["totals"]["outstanding_bytes"]
    assert pm["gap_bytes"] == pm["anon_bytes"] - pm["live_bytes"] and pm["rss_bytes"] > 0
    assert pm["live_growth_bytes_per_min"] >= 0 and "note" not in pm
    text = run_memhook("report", mh.capture, "--min-age", "1").stdout
    assert "Leak suspects" in text and text.index("steady_leak") < text.index("startup_data")
    assert target.finish() == 0


def test_thread_locality_and_transients(tmp_path, targets):
    """threads.c: each worker frees every odd block itself right away (a temporary) and hands
    every even one to the freer thread."""
    target = targets(build(tmp_path, "threads.c"))
    mh = Memhook(target.pid, tmp_path)
    target.command("go")
    mh.stop()
    rep = report_json(mh.capture, "--transient-threshold", "1000")
    churn = next(r for r in rep["thread_locality"] if r["frames"][0]["function"] == "churn_alloc")
    assert churn["alloc_count"] == WORKERS * ITERS
    assert churn["same_thread_share"] == churn["other_thread_share"] == 0.5
    assert churn["live_share"] == 0
    matrix = churn["cross_thread_frees"]
    assert len(matrix) == WORKERS and {m["count"] for m in matrix} == {ITERS // 2}
    assert len({m["free_tid"] for m in matrix}) == 1  # all to the one freer thread
    assert len({m["alloc_tid"] for m in matrix}) == WORKERS
    transient = next(r for r in rep["transient"] if r["frames"][0]["function"] == "churn_alloc")
    assert transient["temporary_share"] == 0.5  # the odd ones: freed before the next alloc
    assert transient["transient_count"] >= WORKERS * ITERS // 2
    sizes = rep["histograms"]["size_log2"]
    expected = [0] * len(sizes)
    for i in range(ITERS):
        expected[(16 + i % 64).bit_length() - 1] += WORKERS
    for w in range(WORKERS):
        expected[(1000 + w).bit_length() - 1] += 100  # thread_leak
    assert sizes == expected
    assert sum(rep["histograms"]["lifetime_ns_log2"]) + \
        sum(rep["histograms"]["lifetime_under_ns_log2"]) == rep["totals"]["free_count"]
    assert target.finish() == 0


def test_memory_growing_outside_malloc_is_noted(tmp_path, targets):
    target = targets(build(tmp_path, "shapes.c"))
    mh = Memhook(target.pid, tmp_path, "--interval", "0.1")
    target.command("mmap")
    mh.stop()
    rep = report_json(mh.capture)
    pm = rep["process_memory"]
    assert pm["live_bytes"] == 0 and pm["anon_growth_bytes_per_min"] > 1e6
    assert "not allocated through malloc" in pm["note"]
    assert target.finish() == 0


def test_plots_and_html_report(tmp_path, targets):
    import re
    target = targets(build(tmp_path, "shapes.c"))
    mh = Memhook(target.pid, tmp_path, "--interval", "0.1")
    target.command("run")
    mh.stop()
    plots = tmp_path / "plots"
    out = tmp_path / "report.html"
    proc = run_memhook("report", mh.capture, "--format", "html", "-o", out, "--plots", plots,
                       "--min-age", "1")
    assert proc.returncode == 0, proc.stderr
    import matplotlib.image
    for name in ("outstanding_over_time", "histograms", "growth"):
        png = plots / f"{name}.png"
        image = matplotlib.image.imread(str(png))
        assert image.shape[0] > 300 and image.shape[1] > 800
        assert image[..., :3].std() > 0.05  # not a blank canvas
    page = out.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", page)  # nothing fetched
    assert "<script src" not in page and "<link" not in page
    assert page.count("<svg") == 3
    assert page.index("steady_leak") < page.index("startup_data")
    flame = flame_stacks(page)
    by_leaf = {stack[-1]: outstanding for stack, _kinds, _labels, outstanding, *_ in flame}
    assert by_leaf["steady_leak"] == 300 * 100 and by_leaf["startup_data"] == 200000
    assert target.finish() == 0


def test_freed_by_the_call_that_allocated(tmp_path, targets):
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    mh = Memhook(target.pid, tmp_path)
    target.command("calls")
    mh.stop()
    rep = report_json(mh.capture)
    share = {r["frames"][0]["function"]: r["same_call_share"] for r in rep["transient"]}
    assert share["scratch_in_call"] == 1.0  # freed inside the allocating call
    assert share["freed_deeper"] == 1.0     # freed by a callee while it was active
    assert share["factory"] == 0.0          # freed by its caller after it returned
    assert target.finish() == 0


def test_a_sawtooth_whose_floor_rises_is_a_suspect(tmp_path, targets):
    """sawtooth.c frees nine blocks in ten every 200 ms, as a collector's cleaner does, and keeps
    the tenth: most of its blocks are freed, its outstanding bytes swing, but the level they
    return to keeps rising, though its busy start peaked higher than anything it holds at the
    end. It is a suspect, growing (the issue's JVM Deflater case: four such stacks held 190 MB
    each and were left out as churn)."""
    target = targets(build(tmp_path, "sawtooth.c"))
    mh = Memhook(target.pid, tmp_path, "--interval", "0.1")
    target.command("run 400 40")  # (peaks of 8000 blocks, 4 MB)
    target.command("run 2400 1")
    mh.stop()
    rep = report_json(mh.capture, "--min-age", "1")
    suspects = {r["frames"][0]["function"]: r for r in rep["leak_suspects"]}
    assert "batch_alloc" in suspects, [r["frames"][0]["function"] for r in rep["leak_suspects"]]
    saw = suspects["batch_alloc"]
    assert saw["growth_bytes_per_min"] > 0
    assert saw["reasons"][0].startswith(("growing, but held", "live blocks of this stack keep"))
    assert target.finish() == 0



@pytest.mark.skipif(not shutil.which("javac"), reason="the JDK is installed by scripts/setup.sh")
def test_a_jvm_leaking_through_deflater(tmp_path):
    """Debian's OpenJDK: Deflaters made at a steady pace, one in ten kept for good, the rest
    ended by the collector's cleaner in batches (tests/targets/Deflaters.java), as the issue
    found a JVM's leak. Its zlib state is malloc'ed under deflateInit2_, called from Java code
    the JIT compiles again and again (each time a new stack above the native frames): the
    deflateInit2_ stacks lead the suspects, growing, held by the kept Deflaters (every block
    reachable); the JIT's own code holds no block the check calls lost; the JVM runs on."""
    subprocess.run(["javac", "-d", str(tmp_path), str(TARGETS / "Deflaters.java")], check=True,
                   capture_output=True, timeout=120)
    jvm = subprocess.Popen(["java", "-Xmx128m", "-cp", str(tmp_path), "Deflaters"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        lines = Lines(jvm.stdout)
        lines.expect("ready")
        mh = Memhook(jvm.pid, tmp_path, "--interval", "1")
        jvm.stdin.write("start\n")
        jvm.stdin.flush()
        time.sleep(12)
        rep_live = mh.stop()
        jvm.stdin.write("count\n")
        jvm.stdin.flush()
        made = int(lines.expect("made").split()[1])
        jvm.stdin.write("exit\n")
        jvm.stdin.flush()
        assert jvm.wait(timeout=60) == 0
    finally:
        jvm.kill()
    assert made > 1000
    rep = report_json(mh.capture)
    first = rep["leak_suspects"][0]
    fn = first["frames"][first["attributed_frame"]]["function"]
    assert fn == "deflateInit2_", [r["frames"][r["attributed_frame"]].get("function")
                                   for r in rep["leak_suspects"][:5]]
    assert first["reasons"][0].startswith("growing, but held"), first["reasons"]
    check = rep_live["leak_check"]
    assert check["forked"] and check["totals"]["definitely_lost_count"] == 0, check
    assert check["root_bytes"]["jit_code"] > 0
