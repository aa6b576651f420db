"""The leak's own frame (issue 35, point 1): a stack is named by its first frame, from the
allocation upwards, that is not the runtime's (libc, libstdc++, inlined std:: code, the loader,
the allocators); every frame stays in the JSON, with the attributed frame's index."""
from __future__ import annotations

import json

from conftest import Target, build, run_memhook, traced

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
    # --runtime-function moves the attribution: the keep_* functions counted as runtime too
    rep = json.loads(run_memhook("report", mh.capture, "--format", "json",
                                 "--runtime-function", "keep_*").stdout)
    again = next(s for s in rep["sites"] if s["outstanding_count"] == 10 and any(
        (f["function"] or "").startswith("keep_strdup") for f in s["frames"]))
    assert (again["frames"][again["attributed_frame"]]["function"] or "").startswith("main")
