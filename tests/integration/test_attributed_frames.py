"""The leak's own frame (issue 35, point 1): a stack is named by its first frame, from the
allocation upwards, that is not the runtime's (libc, libstdc++, inlined std:: code, the loader,
the allocators); every frame stays in the JSON, with the attributed frame's index."""
from __future__ import annotations

import json
import re

from conftest import TARGETS, Target, build, run_memhook, traced
from memhook.common.attribution import qualified_name

OPT = ["-g", "-O2", "-fno-omit-frame-pointer"]


def test_leaks_through_std_and_libc_are_named_by_the_programs_function(tmp_path):
    """std::vector growth, std::map insertion, std::make_shared and strdup: each site is
    attributed to the keep_* function that leaked, not to libstdc++ or libc, in the JSON (the
    index, all frames kept) and in the text (the stack's line leads with it)."""
    target = Target(build(tmp_path, "through_std.cpp", base_flags=OPT))
    mh, report = traced(target, tmp_path, "leak")
    named = {}
    for s in report["sites"]:
        if s["outstanding_bytes"] <= 0:
            continue
        at = s["attributed_frame"]
        function = s["frames"][at]["function"] or ""
        named.setdefault(function.split("(")[0], []).append(s)
        assert all(f.get("function") is not None or f.get("module") for f in s["frames"])
    for leak in ("keep_vector", "keep_map", "keep_shared", "keep_strdup"):
        assert leak in named, sorted(named)
        # the allocating frame itself is the runtime's (operator new, malloc in strdup...)
        for s in named[leak]:
            assert s["attributed_frame"] > 0, [f["function"] for f in s["frames"]]
    strdup_site = named["keep_strdup"][0]
    assert strdup_site["outstanding_count"] == 10
    text = run_memhook("report", mh.capture).stdout
    header = next(line for line in text.splitlines() if line.startswith("#") and
                  "keep_strdup" in line)
    assert ": keep_strdup" in header and "(via " in header, header
    # A program's own wrapper of malloc, named as Redis names it: its caller is attributed.
    wrapped = [s for s in named.get("keep_zmalloc", [])]
    assert len(wrapped) == 1 and wrapped[0]["outstanding_bytes"] == 7 * 300, sorted(named)
    assert wrapped[0]["frames"][wrapped[0]["attributed_frame"] - 1]["function"] == "zmalloc"
    header = next(line for line in text.splitlines() if line.startswith("#") and
                  "keep_zmalloc" in line)
    assert ": keep_zmalloc  " in header and header.endswith("(via zmalloc)"), header
    # --runtime-function moves the attribution: the keep_* functions counted as runtime too
    rep = json.loads(run_memhook("report", mh.capture, "--format", "json",
                                 "--runtime-function", "keep_*").stdout)
    again = next(s for s in rep["sites"] if s["outstanding_count"] == 10 and any(
        (f["function"] or "").startswith("keep_strdup") for f in s["frames"]))
    assert (again["frames"][again["attributed_frame"]]["function"] or "").startswith("main")


def test_live_view_fits_columns_and_names_the_leaks_own_frame(tmp_path):
    """COLUMNS=100: no live-view line is longer than 100 characters, and each stack's line
    leads with the keep_* function in its short name (no parameters, no clone suffix)."""
    import os
    import signal
    import subprocess

    from conftest import Lines, memhook_cmd
    target = Target(build(tmp_path, "through_std.cpp", base_flags=OPT))
    mh = subprocess.Popen(memhook_cmd("-p", target.pid, "--interval", "0.3", "--top", "20"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                          env={**os.environ, "COLUMNS": "100"})
    lines = Lines(mh.stdout)
    lines.expect("attached")
    target.command("leak")
    live = []
    while not all(any(f"B/min  {k}  " in x for x in live)
                  for k in ("keep_vector", "keep_map", "keep_shared", "keep_strdup")):
        live.append(lines.expect("", timeout=20).rstrip("\n"))
    mh.send_signal(signal.SIGINT)
    mh.wait(60)
    assert target.finish() == 0
    shown = [x for x in live if x.startswith(("[", "  "))]
    assert shown and all(len(x) <= 100 for x in shown), max(shown, key=len)
    assert not any("keep_strdup(int)" in x or "[clone" in x for x in shown)
    # To fit, the path into the runtime goes first, then the file's directories: the function
    # and its file:line stay whole, and a line that kept its path into the runtime kept every
    # directory too. (Which lines need cutting depends on how long the checkout's path is.)
    keep = [x for x in shown if "B/min  keep_" in x]
    assert all(re.search(r"B/min  keep_\w+  \S*through_std\.cpp:\d+(  \(via .+\))?$", x)
               for x in keep), keep
    assert all(str(TARGETS / "through_std.cpp") in x for x in keep if "(via " in x), keep


def test_demo_service_and_frameless_target(tmp_path):
    """The demo service (scripts/demo, built as demo.sh builds it) and a frameless target: the
    suspects and stacks are named by the function a person would fix, in short words:
    remember_session, not std::string's _M_mutate in libstdc++; handle_request for its
    session_registry growth, not std::vector's _M_realloc_insert."""
    import subprocess
    import time
    from pathlib import Path

    from conftest import Memhook
    repo = Path(__file__).resolve().parents[2]
    demo = tmp_path / "leaky_service"
    subprocess.run(["g++", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread",
                    str(repo / "scripts/demo/leaky_service.cpp"), "-o", str(demo)], check=True)
    service = subprocess.Popen([str(demo)], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        mh = Memhook(service.pid, tmp_path)
        time.sleep(2)
        report = mh.stop()
    finally:
        service.kill()
        service.wait()
    top = [s for s in report["sites"] if s["outstanding_bytes"] > 0][:6]
    named = [qualified_name(s["frames"][s["attributed_frame"]]["function"] or "") for s in top]
    assert named[0] == "(anonymous namespace)::remember_session", named
    assert set(named) <= {"(anonymous namespace)::remember_session",
                          "(anonymous namespace)::audit_record",
                          "(anonymous namespace)::handle_request"}, named
    text = run_memhook("report", mh.capture).stdout
    first = next(line for line in text.splitlines() if line.startswith("#1 "))
    assert "]: (anonymous namespace)::remember_session  " in first, first
    assert "_M_mutate" not in first and "basic_string" not in first, first
    # The peak's stacks lead the same way, then list their frames from that one on.
    peak = text[text.index("\nPeak: "):text.index("\nTop ")].splitlines()[2:]
    leads = [x for x in peak if re.match(r"  \d+ bytes \(", x)]
    assert leads and all(": (anonymous namespace)::" in x for x in leads), peak
    assert all("_M_mutate" not in x and "__cxx11" not in x for x in leads), leads
    assert not any("_M_mutate" in x or "new_allocator" in x for x in peak), peak
    # A frameless target: each leak, whichever libc or libstdc++ function allocated it, is
    # named by the frameless function of the program's that called it (unwind rows).
    from test_whole_stacks import build_pair, FRAMELESS
    d = tmp_path / "frameless"
    d.mkdir()
    exe = build_pair(d, FRAMELESS)
    target = Target(exe)
    mh, report = traced(target, tmp_path, "strdup 1000", "getline", "asprintf 3000",
                        "string 3000", "vector 3000")
    named = {qualified_name(s["frames"][s["attributed_frame"]]["function"] or "")
             for s in report["sites"] if s["outstanding_bytes"] > 0 and any(
                 (f["function"] or "").startswith("leak_") for f in s["frames"])}
    assert {"leak_strdup", "leak_getline", "leak_asprintf", "leak_string",
            "leak_vector"} <= named, named
