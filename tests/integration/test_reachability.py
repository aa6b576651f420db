"""The leak check at detach (issue 44): valgrind's categories for the blocks of a process memhook
attached to, compared stack by stack with valgrind's own on the same binary."""
from __future__ import annotations

import collections
import os
import platform
import re
import shutil
import signal
import subprocess
import time
import xml.etree.ElementTree as ET

import pytest

from conftest import (TARGETS, Lines, Memhook, Target, build, memhook_cmd, report_json,
                      run_memhook, traced)
from conftest import report as report_text

# The target's cases (tests/targets/reachability.c): a stack is named by its functions there.
CASES = {"lost_list", "lost_cycle", "global", "interior", "xored", "tree", "held_list",
         "stack_holder", "tls_holder", "register_holder"}
KINDS = {"Leak_DefinitelyLost": "definitely_lost", "Leak_IndirectlyLost": "indirectly_lost",
         "Leak_PossiblyLost": "possibly_lost", "Leak_StillReachable": "reachable"}


def case_of(functions, cases=CASES) -> str | None:
    """The first of `functions` that is a case (a C++ name without its parameters)."""
    named = [f.split("(")[0] for f in functions if f and f.split("(")[0] in cases]
    return named[0] if named else None


def valgrind_categories(exe, tmp_path, cases=CASES, commands="all\nexit\n") -> dict:
    """(case, category) -> [bytes, blocks] as valgrind --leak-check=full says at exit."""
    xml = tmp_path / "valgrind.xml"
    subprocess.run(["valgrind", "--leak-check=full", "--show-leak-kinds=all", "--xml=yes",
                    f"--xml-file={xml}", str(exe)], input=commands, text=True,
                   capture_output=True, timeout=300, check=True)
    out = collections.defaultdict(lambda: [0, 0])
    for e in ET.parse(xml).getroot().findall("error"):
        kind = KINDS.get(e.findtext("kind"))
        case = case_of([f.findtext("fn") for f in e.find("stack").findall("frame")], cases)
        if not kind or not case:
            continue
        what = e.find("xwhat")
        direct = re.search(r"\(([\d,]+) direct", what.findtext("text"))
        row = out[(case, kind)]
        row[0] += int(direct.group(1).replace(",", "")) if direct else int(what.findtext("leakedbytes"))
        row[1] += int(what.findtext("leakedblocks"))
    return dict(out)


def lsan_leaks(exe, tmp_path) -> dict:
    """(case, "direct" or "indirect") -> [bytes, blocks] as LeakSanitizer reports at exit, for
    the same source built with clang -fsanitize=leak."""
    out = collections.defaultdict(lambda: [0, 0])
    proc = subprocess.run([str(exe)], input="all\nexit\n", text=True, capture_output=True,
                          timeout=120)
    assert proc.returncode == 23, proc.stderr  # LeakSanitizer's exit code: it found leaks
    for record in re.split(r"\n(?=(?:Direct|Indirect) leak of )", proc.stderr):
        m = re.match(r"(Direct|Indirect) leak of (\d+) byte\(s\) in (\d+) object", record)
        if not m:
            continue
        case = case_of(re.findall(r"#\d+ 0x[0-9a-f]+ in (\w+)", record))
        if case:
            row = out[(case, m.group(1).lower())]
            row[0] += int(m.group(2))
            row[1] += int(m.group(3))
    return dict(out)


def memhook_categories(report, cases=CASES) -> dict:
    out = collections.defaultdict(lambda: [0, 0])
    for s in report["sites"]:
        case = case_of([f.get("function") for f in s["frames"]], cases)
        if not case:
            continue
        for kind in KINDS.values():
            if s[f"{kind}_count"]:
                row = out[(case, kind)]
                row[0] += s[f"{kind}_bytes"]
                row[1] += s[f"{kind}_count"]
    return dict(out)


def traced_all(exe, tmp_path, *args, command: str = "all"):
    """memhook -p on `exe` (with `args`) while it runs `command`, detached: (Memhook,
    report)."""
    target = Target(exe, *args)
    try:
        return traced(target, tmp_path, command)
    finally:
        target.kill()


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is installed by scripts/setup.sh")
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_the_categories_are_valgrinds(tmp_path, opt):
    exe = build(tmp_path, "reachability.c", flags=[opt])
    expected = valgrind_categories(exe, tmp_path)
    mh, report = traced_all(exe, tmp_path)
    got = memhook_categories(report)
    assert got == expected
    # Every case is there, in the category its comment in reachability.c names.
    assert got[("xored", "definitely_lost")] == [1006, 1]
    assert got[("register_holder", "reachable")] == [1009, 1]
    assert got[("interior", "possibly_lost")] == [1005, 1]
    assert got[("lost_cycle", "definitely_lost")] == [1003, 1]
    assert got[("lost_cycle", "indirectly_lost")] == [2006, 2]
    check = report["leak_check"]
    assert check["threads"] == 4 and check["pause_ms"] < 200
    assert check["heaps_known"] and not check.get("skipped")
    # The text says it, and the suspects list the lost blocks first.
    text = report_text(mh.capture).stdout
    assert "leak check at detach (every thread stopped " in text
    assert "definitely lost 4020 bytes in 4 blocks; indirectly lost 6032 bytes in 6 blocks" in text
    assert "1006 bytes in 1 blocks definitely lost" in text
    first = report["leak_suspects"][0]
    assert first["definitely_lost_bytes"] > 0 and "no pointer reaches them" in first["reasons"][0]


def test_the_lost_blocks_are_leaksanitizers(tmp_path):
    """LeakSanitizer reports the same blocks leaked (definitely and indirectly lost together).
    It differs from valgrind in two words, as docs/leak-analysis.md says: a lost cycle is all
    indirect for it (one block definitely lost, two indirectly for memhook and valgrind), and a
    block reached only by an interior pointer is reachable for it (possibly lost here)."""
    lsan = tmp_path / "reachability-lsan"
    subprocess.run(["clang-14", "-g", "-O0", "-fno-omit-frame-pointer", "-fsanitize=leak", "-I",
                    str(TARGETS), str(TARGETS / "reachability.c"), "-o", str(lsan), "-lpthread"],
                   check=True, capture_output=True)
    leaked = lsan_leaks(lsan, tmp_path)
    _, report = traced_all(build(tmp_path, "reachability.c"), tmp_path)
    got = memhook_categories(report)
    cases = {case for case, _ in got} | {case for case, _ in leaked}
    for case in cases:
        mine = [a + b for a, b in zip(got.get((case, "definitely_lost"), [0, 0]),
                                      got.get((case, "indirectly_lost"), [0, 0]))]
        theirs = [a + b for a, b in zip(leaked.get((case, "direct"), [0, 0]),
                                        leaked.get((case, "indirect"), [0, 0]))]
        assert mine == theirs, case
        if case != "lost_cycle":
            assert got.get((case, "definitely_lost")) == leaked.get((case, "direct")), case
    assert leaked[("lost_cycle", "indirect")] == [3009, 3] and ("lost_cycle", "direct") not in leaked
    assert ("interior", "possibly_lost") in got and ("interior", "direct") not in leaked


def test_a_check_past_max_pause_is_skipped_and_said(tmp_path):
    """--max-pause 0: no check can finish in time. The threads are let go, the target runs on
    and exits cleanly, and the report says the check was skipped and why."""
    target = Target(build(tmp_path, "reachability.c"))
    try:
        mh = Memhook(target.pid, tmp_path, "--max-pause", "0")
        target.command("all")
        report = mh.stop()
        target.command("ping")  # it still answers
        assert target.finish() == 0
    finally:
        target.kill()
    assert "--max-pause" in report["leak_check"]["skipped"] or \
        "did not stop in time" in report["leak_check"]["skipped"]
    assert "definitely_lost_bytes" not in report["sites"][0]
    assert "leak check: skipped: " in report_text(mh.capture).stdout


def tracer_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("TracerPid:")).split()[1])


def test_memhook_killed_during_the_check_leaves_the_target_running(tmp_path):
    """memhook killed with -9 while every thread is held for the check (--check-by stop: a
    1 GiB heap takes about half a second to scan): the kernel lets the threads go with their
    tracer, and the target runs on, answers, and ends cleanly."""
    target = Target(build(tmp_path, "held_heap.c", flags=["-O2"]))
    try:
        mh = Memhook(target.pid, tmp_path, "--max-pause", "60000", "--check-by", "stop")
        target.command("fill 1024 4096")
        mh.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while not tracer_of(target.pid):  # the check (a thread of memhook's) holds the threads
            assert time.monotonic() < deadline and mh.proc.poll() is None, "no check seen"
            time.sleep(0.001)
        mh.proc.kill()
        mh.proc.wait()
        time.sleep(0.2)
        assert tracer_of(target.pid) == 0
        with open(f"/proc/{target.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] in "RS"  # running or sleeping
        target.command("ping")  # it answers (its hooks, left by a dead memhook, still run)
        assert target.finish() == 0
    finally:
        target.kill()


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is installed by scripts/setup.sh")
def test_memhook_run_checks_at_exit_as_valgrind_does(tmp_path):
    """Under memhook run the check is taken at the program's exit(), after its exit handlers,
    where valgrind and LeakSanitizer take theirs: the same categories, stack by stack."""
    exe = build(tmp_path, "reachability.c")
    expected = valgrind_categories(exe, tmp_path)
    cap = tmp_path / "run.mh"
    proc = subprocess.run(memhook_cmd("run", "--no-live", "-o", cap, "--", exe),
                          input="all\nexit\n", capture_output=True, text=True, timeout=120,
                          cwd="/")
    assert proc.returncode == 0, proc.stderr
    report = report_json(cap)
    assert report["leak_check"]["when"] == "exit" and report["leak_check"]["threads"] == 4
    assert memhook_categories(report) == expected


def test_a_process_killed_has_no_check_and_says_why(tmp_path):
    """A target killed while traced ran no exit handler: no categories, and the report says so
    rather than showing none lost."""
    target = Target(build(tmp_path, "reachability.c"))
    mh = Memhook(target.pid, tmp_path)
    target.command("all")
    target.kill()
    report = mh.wait()
    assert "exit()" in report["leak_check"]["skipped"]
    assert "definitely_lost_bytes" not in report["sites"][0]


def test_pprof_otlp_and_html_carry_the_lost_bytes(tmp_path):
    """go tool pprof reads a sample type of bytes definitely lost (in-use space stays the
    default); the OTLP request has a profile of it, each lost stack's bytes; the HTML page, as
    Chromium draws it, has the check's line and the suspects' lost bytes, lost ones first."""
    import os
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceRequest)
    mh, _ = traced_all(build(tmp_path, "reachability.c"), tmp_path)
    prof = tmp_path / "heap.pb.gz"
    report_text(mh.capture, "--format", "pprof", "-o", prof)
    cache = subprocess.run(["go", "env", "GOCACHE"], capture_output=True, text=True,
                           check=True).stdout.strip()
    env = dict(os.environ, HOME=str(tmp_path), PPROF_TMPDIR=str(tmp_path), GOCACHE=cache)
    top = subprocess.run(["go", "tool", "pprof", "-top", "-sample_index=definitely_lost_space",
                          str(prof)], capture_output=True, text=True, env=env, timeout=300)
    assert top.returncode == 0, top.stderr
    assert re.search(r"^\s*1006B .* xored$", top.stdout, re.M), top.stdout
    assert re.search(r"Type: inuse_space", subprocess.run(
        ["go", "tool", "pprof", "-top", str(prof)], capture_output=True, text=True, env=env,
        timeout=300).stdout)
    req = ExportProfilesServiceRequest()
    req.ParseFromString(report_otlp(mh.capture, tmp_path).read_bytes())
    d = req.dictionary
    (lost,) = [p for p in req.resource_profiles[0].scope_profiles[0].profiles
               if d.string_table[p.sample_type.type_strindex] == "definitely_lost_space"]
    assert sorted(s.values[0] for s in lost.samples) == [1001, 1003, 1006, 1010]
    from test_views import open_in_chromium
    page = tmp_path / "report.html"
    report_text(mh.capture, "--format", "html", "-o", page)
    dom = open_in_chromium(tmp_path, page)
    assert re.search(r"<th>leak check</th><td> at detach \(every thread stopped [\d.]+ ms, "
                     r"[^)]*\): definitely lost 4020 bytes in 4 blocks", dom), dom[:3000]
    suspects = dom[dom.index("id=\"suspects\""):]
    assert re.search(r"<th class=\"num\"[^>]*>lost</th>", suspects)  # (a sortable column)
    first = suspects[suspects.index("<td>1</td>"):suspects.index("<td>2</td>")]
    assert "definitely lost (no pointer reaches them)" in first


def report_otlp(capture, tmp_path):
    out = tmp_path / "profiles.otlp"
    report_text(capture, "--format", "otlp", "-o", out)
    return out


@pytest.mark.arm64
def test_a_block_held_in_dynamic_tls_is_reachable(tmp_path):
    """A dlopen'ed library's __thread variable lives in a block the loader mallocs on first
    touch, through no slot memhook patches: found through the thread's DTV, it is a root, and
    the block only it holds is reachable, as valgrind says (not lost, as it read before)."""
    lib = tmp_path / "libdynamic_tls.so"
    subprocess.run(["gcc", "-g", "-O0", "-shared", "-fPIC", str(TARGETS / "dynamic_tls_lib.c"),
                    "-o", str(lib)], check=True)
    exe = build(tmp_path, "dynamic_tls.c")
    vg = subprocess.run(["valgrind", "--leak-check=full", "--show-leak-kinds=all", str(exe),
                         str(lib)], input="hold\nexit\n", text=True, capture_output=True,
                        timeout=300)
    assert re.search(r"1,014 bytes in 1 blocks are still reachable", vg.stderr), vg.stderr
    _, report = traced_all(exe, tmp_path, lib, command="hold")
    (s,) = [s for s in report["sites"] if s["outstanding_bytes"] == 1014]
    assert (s["reachable_bytes"], s["definitely_lost_bytes"]) == (1014, 0)


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is installed by scripts/setup.sh")
def test_valgrinds_nine_pointer_chains(tmp_path):
    """tests/targets/leak_matrix.c: valgrind's nine cases of start and interior pointers
    between a root and two blocks (reachable, definitely, indirectly and possibly lost), the
    same categories stack by stack as valgrind's own."""
    cases = {f"case{n}" for n in range(1, 10)}
    exe = build(tmp_path, "leak_matrix.c")
    expected = valgrind_categories(exe, tmp_path, cases)
    assert expected[("case9", "indirectly_lost")] == [88, 1]  # (what the matrix says)
    assert memhook_categories(traced_all(exe, tmp_path)[1], cases) == expected


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is installed by scripts/setup.sh")
def test_valgrinds_heuristics_for_interior_pointers(tmp_path):
    """tests/targets/interior_pointers.cpp: a pre-C++11 std::string's characters, a block past
    its length word, new[]'s array past its cookie and an object held as its second base are
    reached through interior pointers on purpose: reachable, as valgrind's default heuristics
    say; a block held 16 bytes in, none of those shapes, stays possibly lost."""
    cases = {"keep_string", "keep_length64", "keep_array", "keep_derived", "keep_interior"}
    exe = build(tmp_path, "interior_pointers.cpp", flags=["-D_GLIBCXX_USE_CXX11_ABI=0"])
    expected = valgrind_categories(exe, tmp_path, cases)
    assert expected[("keep_string", "reachable")] == [133, 2]  # (the string and its characters)
    assert memhook_categories(traced_all(exe, tmp_path)[1], cases) == expected


# tests/targets/lost_before_attach.cpp: the blocks lost before attach (by size and type), and
# those a block from before attach holds.
BEFORE = {"lose_widgets", "lose_buffers", "main"}
AFTER = {"held_by_old", "lost_through_old", "lost_after"}


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is installed by scripts/setup.sh")
def test_memhook_leaks_names_the_blocks_lost_before_it_came(tmp_path):
    """`memhook leaks -p PID` on a process that lost blocks before anything traced it: no stack
    can name them, so they come by size and C++ type, as macOS's leaks and chap name them; the
    bytes are valgrind's, exit code 23, and the process runs on."""
    exe = build(tmp_path, "lost_before_attach.cpp")
    theirs = valgrind_categories(exe, tmp_path, BEFORE, commands="exit\n")
    target = Target(exe)
    try:
        cap = tmp_path / "leaks.mh"
        proc = run_memhook("leaks", "-p", target.pid, "-o", cap)
        target.command("ping")  # it answers, untouched
        assert target.finish() == 0
    finally:
        target.kill()
    assert proc.returncode == 23, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "definitely lost: 5 blocks of 40 bytes, Widget" in proc.stdout
    assert "definitely lost: 3 blocks of 200 bytes\n" in proc.stdout
    assert "Lost: 800 bytes (800 B), all allocated before attach" in proc.stdout
    check = report_json(cap)["leak_check"]
    groups = {(g["category"], g["size"], g["type"]): (g["blocks"], g["bytes"])
              for g in check["before_attach_lost"]}
    assert groups == {("definitely_lost", 40, "Widget"): (5, 200),
                      ("definitely_lost", 200, ""): (3, 600)}
    lost = [theirs.get((case, "definitely_lost"), [0, 0]) for case in ("lose_widgets", "lose_buffers")]
    assert check["before_attach"]["definitely_lost_bytes"] == sum(b for b, _ in lost) == 800
    assert check["before_attach"]["definitely_lost_count"] == sum(n for _, n in lost) == 8
    assert not check["before_attach"]["indirectly_lost_count"]


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is installed by scripts/setup.sh")
def test_a_block_from_before_attach_holds_or_loses_what_it_points_to(tmp_path):
    """A block allocated while traced whose only pointer is in a block from before attach: held
    if that block is held, indirectly lost if it is lost, as valgrind says on the same binary;
    the lost block from before attach counted apart."""
    exe = build(tmp_path, "lost_before_attach.cpp")
    theirs = valgrind_categories(exe, tmp_path, AFTER | BEFORE, commands="more\nexit\n")
    _, report = traced_all(exe, tmp_path, command="more")
    got = memhook_categories(report, AFTER)
    assert got == {k: v for k, v in theirs.items() if k[0] in AFTER}
    assert got[("held_by_old", "reachable")] == [1016, 1]
    assert got[("lost_through_old", "indirectly_lost")] == [1032, 1]
    assert got[("lost_after", "definitely_lost")] == [2096, 2]
    before = report["leak_check"]["before_attach"]
    assert before["definitely_lost_bytes"] == 800 + theirs[("main", "definitely_lost")][0] == 872


def test_memhook_leaks_asks_the_memhook_already_tracing(tmp_path):
    """A process a memhook traces already: `memhook leaks` cannot attach a second time; it asks
    that memhook, which takes a snapshot with its check and prints it."""
    target = Target(build(tmp_path, "lost_before_attach.cpp"))
    try:
        mh = Memhook(target.pid, tmp_path)
        proc = run_memhook("leaks", "-p", target.pid)
        assert proc.returncode == 0, proc.stderr
        assert "asked it for a snapshot with a leak check" in proc.stdout
        mh.lines.expect("snapshot 1 of PID")
        line = mh.lines.expect("leak check at snapshot")
        assert "(every thread stopped" in line
        report = mh.stop()
        assert target.finish() == 0
    finally:
        target.kill()
    assert len(report["snapshots"]) == 1
    check = report_json(mh.capture, "--snapshot", "1")["leak_check"]
    assert check["when"] == "snapshot"
    assert check["before_attach"]["definitely_lost_bytes"] == 800


def test_the_live_view_shows_the_last_check(tmp_path):
    """The live view carries the last check (a snapshot's: `memhook leaks -p` on a traced
    process asks for one): its line, and a LOST column, the lost bytes of each stack."""
    target = Target(build(tmp_path, "lost_before_attach.cpp"))
    mh = subprocess.Popen(memhook_cmd("-p", target.pid, "--interval", "0.3"), cwd="/",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, COLUMNS="300"))  # (lines not cut short)
    try:
        lines = Lines(mh.stdout)
        lines.expect("attached")
        lines.expect("outstanding")
        assert not any("leak check" in x for x in [lines.expect("outstanding")])
        target.command("more")
        assert run_memhook("leaks", "-p", target.pid).returncode == 0
        lines.expect("snapshot 1 of PID")
        head = lines.expect("leak check at snapshot 1 (")
        # 2096 B definitely lost by lost_after, 1032 B indirectly (lost_through_old), and the
        # 872 B lost before attach.
        assert "lost 3.9 KiB in 12 blocks (872 B of them from before attach)" in head, head
        rows = []
        while not any("lost_after" in x for x in rows):
            rows.append(lines.expect("B/min"))
        row = next(x for x in rows if "lost_after" in x)
        assert re.match(r"\s+2\.0 KiB\s+2\.0 KiB\s+[+-]", row), row
        held = next((x for x in rows if "held_by_old" in x), None)
        assert held is None or re.match(r"\s+1016 B\s+0 B\s+[+-]", held), held
        mh.send_signal(signal.SIGINT)
        mh.wait(60)
        assert mh.returncode == 0
        assert target.finish() == 0
    finally:
        mh.kill()
        target.kill()



def children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is `pid`."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append((int(d), fields[0]))
    return out


@pytest.mark.arm64
def test_a_large_heap_is_read_from_the_targets_copy(tmp_path):
    """By default the check reads a copy-on-write copy the target makes of itself (clone() at
    the hook library's stub) while it runs on: the pause is the copy's, a fraction of the
    stopped scan's, and the answer the same block for block; the copy is reaped."""
    # (64 MiB in the emulated arm64 guest: 512 MiB read stopped there outlasts --max-pause)
    mib = 512 if platform.machine() == "x86_64" else 64
    target = Target(build(tmp_path, "held_heap.c", flags=["-O2"]))
    try:
        target.ask(f"fill {mib} 1024", "blocks")
        got = {}
        for how in ("stop", "fork"):
            cap = tmp_path / f"{how}.mh"
            proc = run_memhook("leaks", "-p", target.pid, "--check-by", how, "--max-pause",
                               "10000", "-o", cap)
            assert proc.returncode == 23, proc.stderr
            got[how] = report_json(cap)["leak_check"]
            assert not children(target.pid)  # the copy reaped (by the target: wait4)
        target.command("ping")
        assert target.finish() == 0
    finally:
        target.kill()
    stop, fork = got["stop"], got["fork"]
    assert fork["forked"] and "forked" not in stop
    # (the second session sees the first's loader blocks for the hook library: reachable,
    # one possibly lost, docs/limitations.md)
    for k in ("definitely_lost_count", "definitely_lost_bytes", "indirectly_lost_count"):
        assert fork["before_attach"][k] == stop["before_attach"][k], k
    assert fork["before_attach"]["definitely_lost_count"] == mib * 1024 // 16
    assert fork["pause_ms"] < stop["pause_ms"] / 3, (fork["pause_ms"], stop["pause_ms"])
    assert fork["pause_ms"] < 200 and fork["reap_ms"] < 50


@pytest.mark.arm64
def test_threads_in_system_calls_go_on_as_they_would(tmp_path):
    """A thread the check had make the clone() was stopped in a system call: it goes back to it
    as the kernel would have sent it back (nanosleep restarted for what was left, a read and a
    sigsuspend waiting on), check after check, whichever thread it was."""
    target = Target(build(tmp_path, "restarts.c"))
    try:
        for _ in range(12):
            target.command("lose")
            proc = run_memhook("leaks", "-p", target.pid)
            assert proc.returncode == 23, proc.stderr
            assert "the copy it made of itself read in" in proc.stdout, proc.stdout
        target.command("poke")
        target.command("wake")
        time.sleep(0.3)
        status = target.ask("status", "bad").split()
        assert target.finish() == 0
    finally:
        target.kill()
    bad, sleeps, got, woken = (int(status[i]) for i in (1, 3, 5, 7))
    assert bad == 0 and sleeps > 12 and got == 1 and woken == 1, status


@pytest.mark.arm64
def test_memhook_killed_while_reading_the_copy(tmp_path):
    """memhook killed with -9 while it reads the target's copy, or at a random moment of the
    copy's making: the copy dies with it (it never runs the program's code), and the target
    runs on and answers. The copy's zombie is reaped by the hook library: when the target
    notices memhook is gone (--unhook-after) or at the next attach."""
    import random
    target = Target(build(tmp_path, "restarts.c"))
    heap = Target(build(tmp_path, "held_heap.c", flags=["-O2"]))
    rng = random.Random(44)
    try:
        heap.ask("fill 512 1024", "blocks")
        for n in range(10):
            who = heap if n % 2 else target
            before = {pid for pid, _ in children(who.pid)}  # (a zombie of the last kill)
            mh = subprocess.Popen(memhook_cmd("leaks", "-p", who.pid, "--unhook-after", "1"),
                                  cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 60
            if who is heap:  # during the scan: this check's copy is there
                while not {pid for pid, _ in children(heap.pid)} - before:
                    assert time.monotonic() < deadline and mh.poll() is None, "no copy seen"
                    time.sleep(0.001)
            else:
                time.sleep(rng.uniform(0.3, 1.5))  # (attach takes about 0.5 s)
            mh.kill()
            mh.wait()
            time.sleep(0.2)
            for pid, state in children(who.pid):
                assert state == "Z", (pid, state)  # dead at once: at most a zombie
            assert tracer_of(who.pid) == 0
            who.command("ping")
            if who is target:  # it allocates: it notices memhook is gone, and reaps
                deadline = time.monotonic() + 30
                while children(target.pid):
                    assert time.monotonic() < deadline, children(target.pid)
                    time.sleep(0.05)
        assert run_memhook("leaks", "-p", heap.pid).returncode == 23  # (its start reaps)
        assert not children(heap.pid)
        target.command("poke")
        target.command("wake")
        time.sleep(0.3)
        status = target.ask("status", "bad").split()
        assert target.finish() == 0 and heap.finish() == 0
    finally:
        target.kill()
        heap.kill()
    assert int(status[1]) == 0 and int(status[5]) == 1 and int(status[7]) == 1, status


def test_pointers_in_a_jits_code_are_roots_at_every_byte(tmp_path):
    """A JIT's machine code (an anonymous mapping writable and executable) keeps pointers as
    instructions' immediates, at any byte: read there word by word at every byte, the block it
    names is reachable. (valgrind and LeakSanitizer read aligned words only: for them it is
    lost, as the block whose pointer sits unaligned in plain data is here too.)"""
    _, report = traced_all(build(tmp_path, "jit_immediate.c"), tmp_path)
    got = memhook_categories(report, {"in_code", "in_data", "nowhere"})
    assert got == {("in_code", "reachable"): [1111, 1], ("in_data", "definitely_lost"): [1112, 1],
                   ("nowhere", "definitely_lost"): [1113, 1]}
    assert report["leak_check"]["root_bytes"]["jit_code"] == 4096


def test_memhook_leaks_of_every_process_of_a_name(tmp_path):
    """`memhook leaks --pid-of NAME`: every process of that name checked, their lost blocks
    from before attach summed by size and type, each process named."""
    exe = build(tmp_path, "lost_before_attach.cpp", name="lostpair")
    a, b = Target(exe), Target(exe)
    try:
        proc = run_memhook("leaks", "--pid-of", "lostpair")
        a.command("ping")
        b.command("ping")
        assert a.finish() == 0 and b.finish() == 0
    finally:
        a.kill()
        b.kill()
    assert proc.returncode == 23, proc.stderr
    head = next(x for x in proc.stdout.splitlines() if x.startswith("memhook leaks:"))
    assert head.startswith("memhook leaks: 2 processes: ") and f"PID {a.pid} " in head, head
    assert "definitely lost: 10 blocks of 40 bytes, Widget" in proc.stdout
    assert "Lost: 1600 bytes" in proc.stdout


def test_a_thread_on_a_malloced_alternate_signal_stack(tmp_path):
    """A thread stopped in a signal handler on an alternate stack malloc gave: that block, from
    its stack pointer up, is its stack (the block its handler holds in a local is reachable);
    the heap above it is no stack (a block lost there is definitely lost, and what only it
    holds indirectly lost, not reached from the lost block's words as from a stack's)."""
    _, report = traced_all(build(tmp_path, "altstack.c"), tmp_path)
    got = memhook_categories(report, {"on_altstack", "lost_above", "lost_below"})
    assert got == {("on_altstack", "reachable"): [1017, 1],
                   ("lost_above", "definitely_lost"): [1018, 1],
                   ("lost_below", "indirectly_lost"): [1019, 1]}, got
