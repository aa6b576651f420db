"""Captures that travel: symbolized after the binary moved or was stripped, cut off by a kill,
read by Go's pprof, folded for flame graphs, compared, and fuzzed."""
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import time
from importlib import resources

import pytest

from conftest import Memhook, Target, build, memhook_cmd, report, report_json, run_memhook, site

LATE_LEAK = 7 * 99  # lifecycle.c: "go" leaks 7 blocks of 99 bytes in late_leak


def go_cache() -> str:
    """Go's build cache as the user has it: `go tool pprof` is built once, not at every HOME a
    test gives it."""
    return subprocess.run(["go", "env", "GOCACHE"], capture_output=True, text=True,
                          check=True).stdout.strip()


def build_id(path):
    from memhook.elf.slots import file_build_id
    return file_build_id(str(path))


def capture_lifecycle(where):
    """A capture of lifecycle.c doing "go" and "inlined"; the binary's path."""
    exe = build(where, "lifecycle.c")
    target = Target(exe, "/nonexistent.so")
    try:
        mh = Memhook(target.pid, where, "--interval", "0.2")
        target.command("go")
        target.command("inlined")
        time.sleep(0.5)  # a few time-series rows
        mh.stop()
        assert target.finish() == 0
    finally:
        target.kill()
    return mh.capture, exe


@pytest.fixture
def captured(tmp_path):
    """A capture of its own, for tests that move, strip or replace the binary."""
    return capture_lifecycle(tmp_path)


@pytest.fixture(scope="module")
def captured_once(tmp_path_factory):
    """One capture shared by the tests that only read reports of it."""
    return capture_lifecycle(tmp_path_factory.mktemp("captured"))


def test_symbolized_after_the_binary_moved(tmp_path, captured):
    cap, exe = captured
    debug_dir = tmp_path / "debug"
    bid = build_id(exe)
    (debug_dir / ".build-id" / bid[:2]).mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(exe),
                    str(debug_dir / ".build-id" / bid[:2] / f"{bid[2:]}.debug")], check=True)
    exe.rename(tmp_path / "moved-away")

    blind = report_json(cap)  # the module is gone: module + offset, and said so
    leak = next(s for s in blind["sites"] if s["outstanding_bytes"] == LATE_LEAK)
    assert leak["frames"][0]["function"] is None and leak["frames"][0]["offset"] > 0
    assert any(m["module"] == str(exe) for m in blind["unsymbolized_modules"])
    assert "not symbolized" in report(cap).stdout

    rep = report_json(cap, "--debug-dir", debug_dir)
    f0 = site(rep, "late_leak")["frames"][0]
    assert f0["file"].endswith("lifecycle.c") and f0["line"] > 0
    assert f0["offset"] == leak["frames"][0]["offset"]
    assert str(exe) not in [m["module"] for m in rep.get("unsymbolized_modules", [])]


def test_stripped_binary_with_debuglink(tmp_path, targets):
    exe = build(tmp_path, "lifecycle.c", name="stripped")
    debug = tmp_path / "stripped.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(debug)], check=True)
    subprocess.run(["strip", "--strip-all", str(exe)], check=True)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(exe)], check=True, cwd=tmp_path)
    assert b"late_leak" not in exe.read_bytes()  # really stripped: the name lives elsewhere
    target = targets(exe, "/nonexistent.so")
    mh = Memhook(target.pid, tmp_path)
    target.command("go")
    mh.stop()
    f0 = site(report_json(mh.capture), "late_leak")["frames"][0]
    assert f0["file"].endswith("lifecycle.c")
    assert target.finish() == 0


def test_a_different_build_is_not_trusted(tmp_path, captured):
    cap, exe = captured
    subprocess.run(["gcc", "-g", "-O1", "-x", "c", "-", "-o", str(exe)],
                   input="int main(void) { return 0; }", text=True, check=True)
    rep = report_json(cap)
    why = {m["module"]: m["reason"] for m in rep["unsymbolized_modules"]}
    assert "build-id" in why[str(exe)]
    leak = next(s for s in rep["sites"] if s["outstanding_bytes"] == LATE_LEAK)
    assert leak["frames"][0]["function"] is None


@pytest.mark.parametrize("symbolizer", ["pyelftools", "auto"])
def test_inlined_frames(captured_once, symbolizer):
    cap, _ = captured_once
    rep = report_json(cap, "--symbolizer", symbolizer)
    frames = site(rep, "make_buffer")["frames"]
    assert frames[0]["inlined"] is True
    src = open(frames[0]["file"]).read().splitlines()
    assert "malloc(n)" in src[frames[0]["line"] - 1]
    assert frames[1]["function"] == "inlined_leak" and "inlined" not in frames[1]
    assert "make_buffer(88)" in src[frames[1]["line"] - 1]
    assert frames[0]["address"] == frames[1]["address"]


def test_json_schema_and_time_series(captured_once):
    import jsonschema
    cap, _ = captured_once
    rep = report_json(cap)
    schema = json.loads(resources.files("memhook").joinpath("report.schema.json").read_text())
    jsonschema.validate(rep, schema)
    series = rep["timeseries"]
    assert len(series) >= 3
    assert series[-1]["outstanding_bytes"] == rep["totals"]["outstanding_bytes"]
    assert [r["time_s"] for r in series] == sorted(r["time_s"] for r in series)


def test_collapsed_stacks(captured_once):
    cap, _ = captured_once
    out = report(cap, "--format", "collapsed").stdout.splitlines()
    folded = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in out}
    leak = [k for k in folded if k.split(";")[-1] == "late_leak"]
    assert len(leak) == 1 and folded[leak[0]] == LATE_LEAK
    assert leak[0].split(";")[-2] == "main"  # root first, leaf last
    counts = report(cap, "--format", "collapsed", "--weight", "count").stdout
    assert any(line.endswith(" 7") and line.split(" ")[0].endswith(";late_leak")
               for line in counts.splitlines())


@pytest.mark.skipif(shutil.which("go") is None, reason="Go is not installed")
def test_go_pprof_reads_the_profile(tmp_path, captured_once):
    cap, _ = captured_once
    out = tmp_path / "heap.pb.gz"
    report(cap, "--format", "pprof", "-o", out)
    assert gzip.decompress(out.read_bytes())
    env = dict(os.environ, HOME=str(tmp_path), PPROF_TMPDIR=str(tmp_path), GOCACHE=go_cache())
    for index, expected in (("inuse_space", f"{LATE_LEAK}B"), ("alloc_objects", "7 ")):
        top = subprocess.run(["go", "tool", "pprof", "-top", f"-sample_index={index}",
                              str(out)], capture_output=True, text=True, env=env, timeout=300)
        assert top.returncode == 0, top.stderr
        line = next(line for line in top.stdout.splitlines() if line.endswith(" late_leak"))
        assert line.split()[0] + ("B" if "space" in index else " ") == expected or \
            line.lstrip().startswith(expected), line
    raw = subprocess.run(["go", "tool", "pprof", "-raw", str(out)], capture_output=True,
                         text=True, env=env, timeout=300).stdout
    assert "build ID" in raw or "Mappings" in raw


def test_diff_between_two_processes(tmp_path, targets):
    exe = build(tmp_path, "lifecycle.c")
    caps = []
    for commands in (["go"], ["go", "second", "second"]):
        target = targets(exe, "/nonexistent.so")
        mh = Memhook(target.pid, tmp_path)
        for c in commands:
            target.command(c)
        mh.stop()
        caps.append(mh.capture)
        assert target.finish() == 0
    d = json.loads(report(caps[0], "--diff", caps[1], "--format", "json").stdout)
    assert d["change_bytes"] == 2 * 4 * 4321
    assert len(d["sites"]) == 1  # late_leak is the same in both: no change
    row = d["sites"][0]
    assert row["change_bytes"] == 8 * 4321 and row["outstanding_count_change"] == 8
    assert row["frames"][0]["function"] == "second_leak"
    assert "+34568 bytes" in report(caps[0], "--diff", caps[1]).stdout


def test_filters(captured_once):
    cap, exe = captured_once
    assert [s["frames"][0]["function"] for s in
            report_json(cap, "--function", "^late_").get("sites")] == ["late_leak"]
    assert report_json(cap, "--module", "no-such-module")["sites"] == []
    assert len(report_json(cap, "--module", exe.name)["sites"]) >= 2
    assert all(s["alloc_bytes"] / s["alloc_count"] >= 90
               for s in report_json(cap, "--min-size", "90")["sites"])
    assert len(report_json(cap, "--top", "1")["sites"]) == 1


def test_record_events(tmp_path, targets):
    from memhook import capture
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    target.command("early")
    mh = Memhook(target.pid, tmp_path, "--record-events", "--interval", "0.2")
    target.command("go")
    mh.stop()
    ev = capture.read(str(mh.capture)).events
    allocs, frees = ev[ev["is_free"] == 0], ev[ev["is_free"] == 1]
    assert len(allocs) == 7 and set(allocs["size"]) == {99}
    assert len(frees) == 0  # the 50 early blocks were unknown: no event for them
    assert list(ev["ts"]) == sorted(ev["ts"])
    assert set(ev["tid"]) == {target.pid}
    assert target.finish() == 0


def test_capture_survives_kill_9(tmp_path, targets):
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    out = tmp_path / "killed.mh"
    mh = subprocess.Popen(memhook_cmd("-p", target.pid, "--no-live", "-o", out, "--interval",
                                      "0.1", "--snapshot-interval", "0.1"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    assert "attached" in mh.stdout.readline()
    target.command("go")
    time.sleep(1.0)
    mh.send_signal(signal.SIGKILL)
    mh.wait()
    proc = run_memhook("report", out, "--format", "json")
    assert proc.returncode == 0 and "cut off" in proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["incomplete"] is True
    assert site(rep, "late_leak")["outstanding_bytes"] == LATE_LEAK


@pytest.mark.parametrize("kill_at", [2.0, 20.0])
def test_kill_9_with_default_intervals(tmp_path, targets, kill_at):
    """memhook killed -9 2 s or 20 s into a session, every interval at its default: the
    cut-off capture reports the leak it had seen and how long it had traced (its checkpoints:
    one a second in, then one per --interval), and a new memhook attaches at once and is
    exact."""
    from conftest import assert_restored, slot_values
    exe = build(tmp_path, "lifecycle.c")
    target = targets(exe, "/nonexistent.so")
    _, before = slot_values(target.pid, exe)
    out = tmp_path / "killed.mh"
    mh = subprocess.Popen(memhook_cmd("-p", target.pid, "--no-live", "-o", out),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    assert "attached" in mh.stdout.readline()
    t0 = time.monotonic()
    target.command("go")
    time.sleep(max(0.0, kill_at - (time.monotonic() - t0)))
    mh.send_signal(signal.SIGKILL)
    mh.wait()
    proc = run_memhook("report", out)
    assert proc.returncode == 0 and "cut off" in proc.stderr, proc.stderr
    head = proc.stdout.splitlines()[0]
    traced = float(re.search(r"([\d.]+) s traced", head).group(1))
    assert 0.9 <= traced <= kill_at and "[capture cut off]" in head, head
    assert "late_leak" in proc.stdout and "No outstanding allocations" not in proc.stdout
    rep = report_json(out)
    assert site(rep, "late_leak")["outstanding_bytes"] == LATE_LEAK
    again = Memhook(target.pid, tmp_path)  # at once: the dead memhook owns nothing
    target.command("go")
    report2 = again.stop()
    assert site(report2, "late_leak")["outstanding_bytes"] == LATE_LEAK
    assert report2["totals"]["unknown_free_count"] == 0
    assert_restored(target.pid, exe, before)
    assert target.finish() == 0


def test_capture_size_is_reported(tmp_path, captured_once):
    cap, _ = captured_once
    assert os.path.getsize(cap) < 200_000


@pytest.mark.parametrize("tool", ["libdw", "llvm-symbolizer", "addr2line"])
def test_system_symbolizers_agree_with_pyelftools(captured_once, tool):
    """Every way of reading lines and inlined calls names the target's own frames alike: the
    native one (libdw, in memhook's process: auto), each system symbolizer, and pyelftools."""
    if tool != "libdw" and shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    cap, exe = captured_once

    def own_frames(rep):  # the target's own frames (libc's depend on its debug package)
        return [[(f["function"], f["file"], f["line"], f.get("inlined", False))
                 for f in s["frames"] if f["module"] == str(exe)] for s in rep["sites"]]

    assert own_frames(report_json(cap, "--symbolizer", tool)) == \
        own_frames(report_json(cap, "--symbolizer", "pyelftools"))


def test_sysroot(tmp_path, captured):
    cap, exe = captured
    root = tmp_path / "rootfs"
    inside = root / str(exe).lstrip("/")
    inside.parent.mkdir(parents=True)
    exe.rename(inside)
    assert site(report_json(cap, "--sysroot", root), "late_leak")["frames"][0]["line"] > 0


def test_unusable_debug_dir_and_sysroot(tmp_path, captured_once):
    cap, _ = captured_once
    for args, words in ((["--debug-dir", tmp_path / "missing"], "cannot be read"),
                        (["--sysroot", tmp_path / "missing"], "not a directory"),
                        (["--symbolizer", "no-such-tool"], "invalid choice")):
        proc = run_memhook("report", cap, *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr


def test_symbols_cached_until_a_debug_file_appears(tmp_path, targets):
    """A report keeps each module's symbols on disk (~/.cache/memhook/symbols, owner-only); the
    next report of the capture reads neither the binary nor its debug file, and one made after
    a debug file appeared where memhook looks for it uses that file."""
    exe = build(tmp_path, "lifecycle.c", name="stripped")
    debug = tmp_path / "stripped.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(debug)], check=True)
    subprocess.run(["strip", "--strip-all", str(exe)], check=True)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(exe)], check=True, cwd=tmp_path)
    hidden = debug.rename(tmp_path / "hidden")
    target = targets(exe, "/nonexistent.so")
    mh = Memhook(target.pid, tmp_path)
    target.command("go")
    mh.stop()
    assert target.finish() == 0

    def traced_report() -> tuple[dict, str]:
        log = tmp_path / "strace.log"
        out = tmp_path / "report.json"
        subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(log),
                        *memhook_cmd("report", mh.capture, "--format", "json", "-o", str(out))],
                       check=True, cwd="/")
        return json.loads(out.read_text()), log.read_text()

    without, _ = traced_report()
    leak = next(s for s in without["sites"] if s["outstanding_bytes"] == LATE_LEAK)
    assert leak["frames"][0]["file"] is None  # no debug file: no line, and no name in .symtab
    hidden.rename(debug)
    with_debug, opened = traced_report()
    assert f'"{debug}"' in opened  # the cache noticed the file that appeared
    f0 = site(with_debug, "late_leak")["frames"][0]
    assert f0["file"].endswith("lifecycle.c") and f0["line"] > 0
    again, opened = traced_report()
    assert f'"{debug}"' not in opened and f'"{exe}"' not in opened, opened
    assert again["sites"] == with_debug["sites"]
    cache = os.path.expanduser("~/.cache/memhook/symbols")
    entries = [e for e in os.listdir(cache) if e.startswith(build_id(exe))]
    assert entries and os.stat(cache).st_mode & 0o777 == 0o700
    assert all(os.stat(os.path.join(cache, e)).st_mode & 0o777 == 0o600 for e in entries)


@pytest.mark.parametrize("symbolizer", ["pyelftools", "auto"])
def test_symbolizing_leaves_no_file_to_the_collector(tmp_path, monkeypatch, captured_once,
                                                      symbolizer):
    """The ELF files read to build a module's tables are closed by the symbolizer (pyelftools'
    DWARF file when its tables go), not by the garbage collector, whose ResourceWarning can
    surface inside any later import (test_reporters.py's test_html failed so in CI once)."""
    import gc
    import warnings
    from memhook import capture as capture_mod
    from memhook.symbolize import Symbolizer
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no tables on disk: every file read
    cap, _ = captured_once
    c = capture_mod.read(str(cap))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        sym = Symbolizer(c.modules, tool=symbolizer)
        sym.prepare(c.stack_frames)
        named = {f.function for a in c.stack_frames.tolist() for f in sym.frames(a)}
        del sym
        gc.collect()
    assert "late_leak" in named, named  # (the target's files were read)
    unclosed = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    assert not unclosed, unclosed
