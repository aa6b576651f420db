"""The heap before attach (issue 33): glibc malloc's heap walked from outside while the target
runs (memhook/consumer/heap_census.py, hook_cpp/census/), checked against what the target knows it holds
and against glibc's own statistics (mallinfo, malloc_stats) taken at the same moment; the trim
estimate against what malloc_trim(0) then really returns; a heap changing under the walk; a
corrupt heap. On this host, and in the older and newer glibc roots of test_libcs.py."""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import time

import pytest

from conftest import TARGETS, Memhook, build, run_memhook
from test_libcs import musl_target, place, started  # noqa: F401 (fixtures)

from memhook.common import resident
from memhook.consumer import heap_census

CLASSES = ("Order", "Session", "shapes::Plugin")


def build_census_target(tmp_path):
    lib = tmp_path / "libcensus_shapes.so"
    subprocess.run(["g++", "-g", "-O0", "-shared", "-fPIC", str(TARGETS / "census_shapes.cpp"),
                    "-o", str(lib)], check=True, capture_output=True)
    return build(tmp_path, "heap_census.cpp",
                 flags=["-L", str(tmp_path), f"-Wl,-rpath,{tmp_path}"], libs=["-lcensus_shapes"])


def truth(target) -> dict:
    """The target's own account, taken now: its live objects per class, mallinfo, and
    malloc_stats' system and in-use bytes per arena (in glibc's order: main_arena, then next)."""
    target.proc.stdin.write("truth\n")
    target.proc.stdin.flush()
    lines = []
    while True:
        line = target.expect("")
        if line.startswith("done"):
            break
        lines.append(line)
    text = "".join(lines)
    words = re.search(r"classes Order (\d+) Session (\d+) shapes::Plugin (\d+)", text).groups()
    info = dict(re.findall(r"(\w+) (\d+)", text.split("mallinfo", 1)[1].splitlines()[0]))
    arenas = [(int(s), int(u)) for s, u in re.findall(
        r"Arena \d+:\nsystem bytes\s+=\s+(\d+)\nin use bytes\s+=\s+(\d+)", text)]
    return {"classes": dict(zip(CLASSES, map(int, words))),
            "mallinfo": {k: int(v) for k, v in info.items()}, "arenas": arenas}


def check_census(census: dict, own: dict, module: str) -> None:
    """The census against the target's own account: classes exact, free bytes per arena within
    1 % of malloc_stats (system - in use: bins, fastbins and top, as glibc counts free; tcache
    counts as in use there), the two mmapped blocks, and the 32 MiB hole found trimmable."""
    assert census["problem"] == "", census["problem"]
    types = {t["type"]: t for t in census["by_type"]}
    for name, count in own["classes"].items():
        assert types[name]["blocks"] == count, (name, types.get(name))
    assert types["shapes::Plugin"]["module"].endswith("/libcensus_shapes.so")
    assert types["Order"]["module"] == module
    assert len(census["arenas"]) == len(own["arenas"]) == 5
    for a, (system, in_use) in zip(census["arenas"], own["arenas"]):
        free = a["free"]["bins"]["bytes"] + a["free"]["fastbins"]["bytes"] + a["free"]["top"]["bytes"]
        assert a["system_bytes"] == system
        assert abs(free - (system - in_use)) <= 0.01 * (system - in_use), (a, system, in_use)
    mi = own["mallinfo"]
    total_free = sum(a["free_bytes"] - a["free"]["tcache"]["bytes"] for a in census["arenas"])
    assert abs(total_free - mi["fordblks"]) <= 0.01 * mi["fordblks"], (total_free, mi)
    assert census["mmapped"]["blocks"] == mi["hblks"] == 2
    assert census["mmapped"]["bytes"] + 2 * 16 == mi["hblkhd"]
    sizes = {s["size"]: s["blocks"] for s in census["by_size"]}
    assert sizes[216] == own["classes"]["Session"]      # new Session: 208 bytes asked
    assert sizes[2008] == 300 and sizes[7016] == 200    # the strings' buffers
    assert census["uncertain_bytes"] == 0
    main = census["arenas"][0]
    assert main["main"] and main["heaps"][0]["top_pinned_by"]["size"] == 72  # malloc(64)
    assert 30 << 20 <= census["trimmable_bytes"] <= 33 << 20


@pytest.mark.arm64
def test_census_of_the_heap_before_attach(tmp_path, targets):
    """What the issue's target held before attach, as the report gives it: classes exact, free
    space per arena against malloc_stats, the resident table still summing to smaps with the
    heap split, the 64 MiB mapping "the program's mmap", and the trim estimate within 10 % of
    the RSS that malloc_trim(0) then returns."""
    exe = build_census_target(tmp_path)
    target = targets(exe)
    mh = Memhook(target.pid, tmp_path)
    own = truth(target)  # (the target idle since before attach: the same heap the census saw)
    target.command("free")  # pre-attach blocks freed in the session: matched to the census
    report = mh.stop()
    # Before the session's first allocation, memhook said what the memory was made of.
    assert re.search(r"^memhook: resident at attach [\d.]+ MiB: [\d.]+ MiB anonymous \(the "
                     r"program's mmap\), [\d.]+ MiB malloc heap: free chunks \(main arena\)",
                     mh.stderr, re.M), mh.stderr
    assert ("memhook: held before attach: 32110 live blocks, 7.8 MiB (Order 23100, Session 3000, "
            "shapes::Plugin 5000, ...); malloc keeps 31.7 MiB free, about 30.6 MiB of it "
            "resident and trimmable") in mh.stderr, mh.stderr
    check_census(report["heap_census"]["attach"], own, str(exe))
    freed = report["heap_census"]["attach"]["freed_in_session"]
    by_type = {r["type"]: r for r in freed["by_type"]}
    assert (by_type["Order"]["freed_blocks"], by_type["Order"]["held_blocks"]) == (1000, 22100)
    assert by_type["shapes::Plugin"]["freed_blocks"] == 500
    assert by_type["Session"]["freed_blocks"] == 0
    by_size = {r["size"]: r for r in freed["by_size"]}
    assert by_size[1052656]["freed_blocks"] == 1  # the mmapped 1 MiB block
    assert freed["freed_blocks"] == 1501
    assert report["totals"]["unknown_free_count"] == 1501
    parts = {p["part"]: p for p in report["resident_memory"]["parts"]}
    assert parts["anonymous (the program's mmap)"]["rss_bytes"] >= 32 << 20
    assert parts["malloc's mmapped chunks"]["rss_bytes"] == 3149824  # (the 1 MiB one freed)
    assert parts["malloc heap: free chunks (main arena)"]["rss_bytes"] >= 30 << 20
    text = run_memhook("report", mh.capture).stdout
    assert re.search(r"Held before attach \(glibc malloc's heap walked at attach.*\): "
                     r"\d+ live blocks", text), text
    assert re.search(r"^\s+5000\s+\S+ \S+\s+500\s+4500\s+shapes::Plugin "
                     r"\(libcensus_shapes\.so\)$", text, re.M), text
    assert "the main heap's top is held by a live block of 72 B" in text
    assert "freed during the session: 1501 of them" in text, text
    assert re.search(r"^\s+23100\s+\S+ \S+\s+1000\s+22100\s+Order \(heap_census\)$", text,
                     re.M), text
    # The split table against smaps, the target idle: every field's sum is smaps' own.
    census, _ = heap_census.take(target.pid, "glibc", report["libc"].split()[1])
    for _ in range(20):
        before = resident.totals(target.pid)
        table = resident.table(target.pid, census)
        if resident.totals(target.pid) == before:
            break
    assert sum(p["rss_bytes"] for p in table) == before["Rss"]
    assert sum(p["private_dirty_bytes"] for p in table) == before["Private_Dirty"]
    # malloc_trim(0), called by the target itself: what it returned against the estimate.
    line = target.ask("trim", "trim before").split()
    dropped = int(line[2]) - int(line[4])
    estimate = census["trimmable_bytes"]
    assert abs(estimate - dropped) <= 0.1 * dropped, (estimate, dropped)
    assert target.finish() == 0


def test_types_that_grew_and_the_block_that_pins_the_top(tmp_path, targets):
    """After attach the target makes 2000 more Orders and grows its main heap by 40 MiB: at
    detach Order is a type with more live blocks than at attach (+2000), and the block that
    then holds the main heap's top is named with the stack that allocated it (gdb's frames)."""
    target = targets(build_census_target(tmp_path))
    mh = Memhook(target.pid, tmp_path)
    target.command("grow")
    report = mh.stop()
    grew = {t["type"]: t for t in report["heap_census"]["growing_types"]}
    assert (grew["Order"]["attach_blocks"], grew["Order"]["detach_blocks"]) == (23100, 25100)
    assert set(grew) == {"Order"}, grew
    pin = report["heap_census"]["detach"]["arenas"][0]["heaps"][0]["top_pinned_by"]
    assert pin["size"] == 10008 and [f["function"] for f in pin["frames"][:2]] == [
        "grow_heap()", "main"], pin  # (C++: as gdb names it)
    text = run_memhook("report", mh.capture).stdout
    assert "at detach, the main heap's top is held by a block of 10008 B allocated in the " \
           "session:" in text, text
    assert re.search(r"^\s+\+2000\s+25100 blocks  Order \(heap_census\)$", text, re.M), text
    assert target.finish() == 0


def test_census_while_threads_allocate_and_free(tmp_path, targets):
    """Four threads replacing objects at full speed (their live count held at 4 x 5000 after
    warm-up): every census ends, says what it could not read consistently, and counts within
    1 % of the target's own tally."""
    target = targets(build(tmp_path, "heap_churn.cpp", flags=["-O1"]))
    tally = int(target.ask("tally", "tally").split()[1])
    seen = []
    for _ in range(10):
        started_at = time.monotonic()
        census, _ = heap_census.take(target.pid, "glibc", glibc_here())
        assert time.monotonic() - started_at < 10
        assert census["problem"] == ""
        types = {t["type"]: t["blocks"] for t in census["by_type"]}
        seen.append((types.get("Churn", 0), census["uncertain_bytes"],
                     [h["problem"] for a in census["arenas"] for h in a["heaps"] if h["problem"]]))
    counts = sorted(c for c, _, _ in seen)
    assert abs(counts[len(counts) // 2] - tally) <= 0.01 * tally, (seen, tally)
    # What the walk could not read is said in bytes, and in words where it stopped.
    for count, uncertain, problems in seen:
        assert bool(uncertain) == bool(problems), seen
    rounds = target.ask("rounds", "rounds")
    assert target.finish() == 0, rounds


def test_corrupt_heap_stops_the_walk_there_and_the_rest_stands(tmp_path, targets):
    """A chunk header overwritten on purpose: the main heap's walk stops at it and says where;
    the thread arenas, the mmapped chunks and the rest of the report stand; the target is
    unharmed."""
    exe = build_census_target(tmp_path)
    target = targets(exe)
    target.command("corrupt")
    mh = Memhook(target.pid, tmp_path)
    report = mh.stop()
    census = report["heap_census"]["attach"]
    main = census["arenas"][0]["heaps"][0]
    assert re.fullmatch(r"chunk at 0x[0-9a-f]+ has an impossible header \(size field 0x7\): "
                        r"the walk stopped there", main["problem"]), main
    assert census["uncertain_bytes"] > 0
    assert [h["live_blocks"] for a in census["arenas"][1:] for h in a["heaps"]] == [900] * 4
    assert census["mmapped"]["blocks"] == 2
    text = run_memhook("report", mh.capture).stdout
    assert "not walked: chunk at 0x" in text and "uncertain:" in text, text
    assert report["totals"]["alloc_count"] == 0
    target.command("truth")  # (malloc's statistics walk the heap's bins: still sound)
    assert target.finish() == 0


def test_memhook_trim_returns_what_the_census_said(tmp_path, targets):
    """`memhook trim -p PID`: malloc_trim(0) in the target through the GDB agent; the resident
    memory it returned, as memhook prints it and as the kernel says, within 10 % of the census's
    estimate; a second trim returns nothing; the target is unharmed."""
    target = targets(build_census_target(tmp_path))
    before = resident.totals(target.pid)["Rss"]
    out = run_memhook("trim", "-p", target.pid)
    assert out.returncode == 0 and not out.stderr, out
    after = resident.totals(target.pid)["Rss"]
    m = re.fullmatch(r"PID \d+: malloc_trim\(0\) returned 1 \(memory released\); resident "
                     r"\S+ \w+ -> \S+ \w+ \(([\d.]+) MiB returned; the heap census estimated "
                     r"([\d.]+) MiB\); the target was paused [\d.]+ ms\n", out.stdout)
    assert m, out.stdout
    returned, estimate = float(m.group(1)), float(m.group(2))
    assert abs(returned - estimate) <= 0.1 * returned, out.stdout
    assert abs((before - after) / 2**20 - returned) <= 1.0, (before, after, out.stdout)
    again = run_memhook("trim", "-p", target.pid)
    assert "(0 B returned; the heap census estimated 0 B)" in again.stdout, again
    assert truth(target)["classes"]["Order"] == 23100
    assert target.finish() == 0


@pytest.mark.arm64
def test_musl_target_said_without_census_or_trim(tmp_path, musl_target, targets):  # noqa: F811
    """musl has neither glibc's heap nor malloc_trim: one line each, never a traceback."""
    target = targets(musl_target)
    out = run_memhook("trim", "-p", target.pid)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out
    assert re.fullmatch(r"memhook: PID \d+'s libc \(musl [\d.]+\) has no malloc_trim: "
                        r"nothing to call\n", out.stderr), out.stderr
    mh = Memhook(target.pid, tmp_path)
    report = mh.stop()
    assert report["heap_census"]["attach"]["problem"] == (
        "the heap census reads glibc's malloc; this target's libc is musl")
    text = run_memhook("report", mh.capture).stdout
    assert "Held before attach: no heap census (the heap census reads glibc's malloc" in text


def test_census_in_older_and_newer_glibc(tmp_path, place):  # noqa: F811
    """The same target built and run in the Debian 11 (glibc 2.31) and 13 (2.41) roots, under
    chroot and in a mount namespace: the same results as on this host."""
    d = place.workdir()
    for f in ("harness.h", "heap_census.cpp", "census_shapes.cpp"):
        shutil.copy(TARGETS / f, d / f)
    place.sh(d, "g++ -g -O0 -shared -fPIC census_shapes.cpp -o libcensus_shapes.so && "
                "g++ -g -O0 -I. heap_census.cpp -o heap_census -L. -lcensus_shapes "
                f"-Wl,-rpath,{place.inside(d)} -lpthread")
    target = started(place, d / "heap_census")
    mh = Memhook(target.pid, tmp_path)
    own = truth(target)
    report = mh.stop()
    assert report["libc"] == place.libc
    check_census(report["heap_census"]["attach"], own, place.seen(d / "heap_census"))
    assert target.finish() == 0


def glibc_here() -> str:
    out = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout
    return re.search(r"(\d+\.\d+)\s*$", out.splitlines()[0]).group(1)


def test_census_of_a_child_whose_heap_grew_after_fork(tmp_path):
    """A forked child's [heap] is two mappings once it grows (PostgreSQL's backends: every one
    of them had no census): the census takes them as one heap and finds the child's blocks."""
    exe = build(tmp_path, "forked_heap.c")
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline().split()[1])
        with open(f"/proc/{child}/maps") as f:
            heaps = [line for line in f if line.rstrip().endswith("[heap]")]
        assert len(heaps) >= 2, heaps  # (the kernel's doing, which this test depends on)
        census, _ = heap_census.take(child, "glibc", platform.libc_ver()[1])
        assert census["problem"] == "", census["problem"]
        sizes = {s["size"]: s["blocks"] for s in census["by_size"]}
        assert sizes[1000] == 3000, sizes  # (usable size of malloc(1000))
    finally:
        proc.kill()
        proc.wait()


BUSY_PYTHON = """
import numpy, ssl, sqlite3, sys
db = sqlite3.connect(":memory:")
keep = []
print("ready", flush=True)
while True:
    keep.append({i: str(i) * 3 for i in range(200)})
    numpy.arange(1000).tolist()
    db.execute("select 1").fetchall()
    if len(keep) > 2000:
        del keep[:1000]
"""


def test_census_finds_the_arenas_of_a_busy_python_every_time(tmp_path):
    """A python3 with numpy, ssl and sqlite3 loaded, allocating as fast as it can: the census
    (as at every attach) finds main_arena and walks every arena 100 times in 100, however its
    heap moves meanwhile (its top past the [heap] read a moment before: the heap grew)."""
    import sys
    py = subprocess.Popen([sys.executable, "-c", BUSY_PYTHON], stdout=subprocess.PIPE,
                          text=True)
    try:
        assert py.stdout.readline().strip() == "ready"
        version = platform.libc_ver()[1]
        problems = []
        for _ in range(100):
            census, _ = heap_census.take(py.pid, "glibc", version)
            problems += [census["problem"]] if census.get("problem") else [
                p for a in census["arenas"] for p in a["problems"]]
            assert census.get("problem") or census["live"]["blocks"] > 0
        assert not problems, problems
    finally:
        py.kill()
        py.wait()


PG_BIN = "/usr/lib/postgresql/15/bin"


def as_postgres(*argv, **kw):
    return subprocess.run(["runuser", "-u", "postgres", "--", *map(str, argv)], **kw)


@pytest.mark.xdist_group("heavy")  # every core busy: never beside another heavy test
@pytest.mark.skipif(not os.path.exists(f"{PG_BIN}/postgres"),
                    reason="PostgreSQL 15 is installed by scripts/setup.sh")
def test_census_of_every_postgres_process_under_pgbench(tmp_path):
    """Debian's PostgreSQL 15 under pgbench (4 clients, both cores busy): the census finds the
    arenas of every process of it, ten times each, and so does every attach of memhook -p to
    all of them (6 of its 10 processes once said "main_arena not found")."""
    import random
    import tempfile
    from pathlib import Path
    # (pytest's tmp_path lies under a directory only root may enter: the server runs as postgres)
    home = Path(tempfile.mkdtemp(prefix="memhook-pg-", dir="/tmp"))
    shutil.chown(home, "postgres")
    data, port = home / "pgdata", random.randrange(20000, 30000)
    as_postgres(f"{PG_BIN}/initdb", "-D", data, "-A", "trust", "-U", "postgres", check=True,
                capture_output=True)
    server = subprocess.Popen(["runuser", "-u", "postgres", "--", f"{PG_BIN}/postgres", "-D",
                               str(data), "-p", str(port), "-k", str(home), "-c",
                               "listen_addresses="], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    bench = None
    try:
        for _ in range(200):
            if as_postgres(f"{PG_BIN}/pg_isready", "-h", home, "-p", port,
                           capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        pgbench = [f"{PG_BIN}/pgbench", "-h", home, "-p", port]
        as_postgres(*pgbench, "-i", "-s", "2", "-q", "postgres", check=True, capture_output=True)
        bench = subprocess.Popen(["runuser", "-u", "postgres", "--", *map(str, pgbench), "-c",
                                  "4", "-j", "2", "-T", "120", "postgres"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        pids = [postmaster] + [int(d) for d in os.listdir("/proc") if d.isdigit() and
                               _ppid(int(d)) == postmaster]
        assert len(pids) >= 8, pids  # (checkpointer, writers, launchers, 4 backends)
        version = platform.libc_ver()[1]
        problems = []
        for _ in range(10):
            for pid in pids:
                try:
                    census, _ = heap_census.take(pid, "glibc", version)
                except OSError:
                    continue  # (a backend that ended)
                problems += [f"{pid}: {census['problem']}"] if census.get("problem") else [
                    f"{pid}: {p}" for a in census["arenas"] for p in a["problems"]]
        assert not problems, problems
        cap = tmp_path / "pg.mh"
        proc = run_memhook("-p", ",".join(map(str, pids)), "--no-live", "--duration", "3",
                           "-o", cap, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "no heap census" not in proc.stderr, proc.stderr
        from memhook import capture
        traced = capture.read_processes(str(cap))
        assert len(traced) == len(pids)
        for p in traced:
            assert not p.meta["heap_census"]["attach"].get("problem"), p.meta["pid"]
        assert bench.poll() is None  # pgbench still running: no backend broke
    finally:
        if bench is not None:
            bench.kill()
        as_postgres(f"{PG_BIN}/pg_ctl", "stop", "-D", data, "-m", "fast", "-w",
                    capture_output=True)
        server.wait(30)
        shutil.rmtree(home, ignore_errors=True)


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0
