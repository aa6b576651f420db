"""Several processes' captures as one (capture.merge): the same program mapped at different
addresses is one module, equal stacks are one, their aggregates summed, each process's share
kept; a stack's identity (module by build-id, ELF offset) is the one --diff matches by."""
from __future__ import annotations

import numpy as np
import pytest

import synthetic
from memhook import capture
from memhook.reporters import model
from memhook.symbolize import Symbolizer


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return synthetic.compile_program(tmp_path_factory.mktemp("program"))


def stacks(program):
    framed = synthetic.return_addresses(program, "framed")[0]
    frameless = synthetic.return_addresses(program, "frameless")[0]
    main_framed, main_frameless = synthetic.return_addresses(program, "main")[:2]
    return [framed, main_framed], [frameless, main_frameless]


def test_same_program_at_two_addresses(program):
    a, b = stacks(program)
    one = synthetic.make(program, [synthetic.Stack(a, 3, 300)], pid=100,
                         bias=0x555555554000)
    two = synthetic.make(program, [synthetic.Stack(b, 2, 64), synthetic.Stack(a, 5, 500, 1, 100)],
                         pid=200, bias=0x563412340000)
    merged = capture.merge([one, two])
    assert len(merged.modules) == 1
    assert merged.stack_count == 3  # none, a, b
    rep = model.build(merged, Symbolizer(merged.modules, tool="pyelftools"))
    by_name = {tuple(f["function"] for f in s["frames"]): s for s in rep["sites"]}
    assert by_name[("framed", "main")]["outstanding_bytes"] == 300 + 400
    assert by_name[("framed", "main")]["alloc_count"] == 8
    assert by_name[("frameless", "main")]["outstanding_bytes"] == 64
    shares = {p["pid"]: p["outstanding_bytes"] for p in by_name[("framed", "main")]["processes"]}
    assert shares == {100: 300, 200: 400}
    assert rep["totals"]["outstanding_bytes"] == 764
    assert [c.meta["pid"] for c in merged.processes] == [100, 200]
    # each process's stacks map to the merged ones
    assert list(merged.by_process["stack_map"][1][1:]) == [2, 1]


def test_stack_identity_ignores_where_the_module_was_mapped(program):
    a, _ = stacks(program)
    reps = []
    for bias in (0x555555554000, 0x7f0000000000):
        cap = synthetic.make(program, [synthetic.Stack(a, 1, 10)], bias=bias)
        rep = model.build(cap, Symbolizer(cap.modules, tool="pyelftools"))
        reps.append(capture.stack_key(rep["sites"][0]["frames"],
                                      {m["path"]: m["build_id"] for m in cap.modules}))
    assert reps[0] == reps[1]
    assert reps[0][0][0] == synthetic.module(program)["build_id"]


def test_diff_matches_stacks_across_addresses(program):
    a, b = stacks(program)
    before = synthetic.make(program, [synthetic.Stack(a, 1, 100)], bias=0x555555554000)
    after = synthetic.make(program, [synthetic.Stack(a, 3, 300), synthetic.Stack(b, 1, 8)],
                           bias=0x563412340000)
    sym = Symbolizer(before.modules, tool="pyelftools")
    d = model.diff(model.build(before, sym), model.build(after, sym.for_modules(after.modules)),
                   before, after)
    changes = {tuple(f["function"] for f in r["frames"]): r["change_bytes"] for r in d["sites"]}
    assert changes == {("framed", "main"): 200, ("frameless", "main"): 8}
    assert d["change_bytes"] == 208


def test_merging_keeps_frames_outside_modules(program):
    a, _ = stacks(program)
    jit = 0x7fff00001234  # code in no file: kept as it is
    one = synthetic.make(program, [synthetic.Stack([jit, *a], 1, 10)], pid=1)
    two = synthetic.make(program, [synthetic.Stack([jit, *a], 1, 20)], pid=2, bias=0x560000000000)
    merged = capture.merge([one, two])
    assert merged.stack_count == 2
    assert int(merged.frames(1)[0]) == jit
    assert int(merged.sites["outstanding_bytes"][1]) == 30
    from memhook.capture.merge import MERGED_BASE
    assert np.all(merged.frames(1)[1:] >= MERGED_BASE)  # the program's frames moved
