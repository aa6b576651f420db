"""Allocators besides libc's (issue 32): what memhook cannot trace yet, it says, at attach and in
every report, never "no leak" in silence."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import Memhook, build, run_memhook

JEMALLOC_A = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.a")


@pytest.fixture
def linked_jemalloc(tmp_path):
    if not JEMALLOC_A.exists():
        message = "libjemalloc-dev is not installed (scripts/setup.sh installs it)"
        if os.environ.get("MEMHOOK_REQUIRE_ROOTS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return build(tmp_path, "linked_allocator.c", libs=[str(JEMALLOC_A), "-lm"])


def test_allocator_linked_into_the_executable_is_said(tmp_path, linked_jemalloc, targets):
    """jemalloc linked into the executable: the start line and the report say that its own
    malloc calls and jemalloc's API are not traced; what does pass through a slot (libc's
    strdup, bound to the executable's malloc) is exact."""
    target = targets(linked_jemalloc)
    mh = Memhook(target.pid, tmp_path)
    target.command("leak")
    report = mh.stop()
    assert target.finish() == 0
    exe = str(linked_jemalloc)
    said = [line for line in mh.stderr.splitlines() if exe in line]
    assert any("malloc family" in line and "its own calls reach no slot and are not traced"
               in line for line in said), mh.stderr
    assert any("jemalloc's API" in line and "mallocx" in line and "not traced" in line
               for line in said), mh.stderr
    dup = [s for s in report["sites"] if s["frames"][0]["function"] in ("strdup", "__strdup")]
    assert [(s["outstanding_bytes"], s["frames"][1]["function"]) for s in dup] == [(300, "leak")]
    # (through libc's own slot, bound to the executable's malloc)
    assert report["totals"]["outstanding_bytes"] == 300
    traced = {a["family"].split()[0]: a["traced"] for a in report["allocators"]}
    assert traced == {"the": "from other objects only", "jemalloc's": "no"}, report["allocators"]
    text = run_memhook("report", mh.capture).stdout
    notes = [line for line in text.splitlines() if exe in line and "not traced" in line]
    assert len(notes) == 2, text
    assert text.index(notes[0]) < text.index("Leak suspects")  # in the header, before leaks
    assert json.loads(run_memhook("report", mh.capture, "--format", "json").stdout)[
        "allocators"] == report["allocators"]
