"""Leak suspects from a capture's time series: a stack that keeps accumulating ranks first, a
cache that filled and plateaued is said to have plateaued, per-request churn is no suspect."""
from __future__ import annotations

import pytest

import synthetic
from memhook.reporters import analysis


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return synthetic.compile_program(tmp_path_factory.mktemp("program"))


def test_leak_before_cache_and_no_churn(program):
    a = synthetic.return_addresses(program, "framed")[:1]
    b = synthetic.return_addresses(program, "frameless")[:1]
    c = synthetic.return_addresses(program, "main")[:1]
    samples = 60
    leak = [100 * (i + 1) for i in range(samples)]                      # +100 B per sample
    cache = [min(2000 * (i + 1), 20000) for i in range(samples)]       # fills, then holds
    churn = [300 if i % 2 else 0 for i in range(samples)]              # per request
    cap = synthetic.make(program, [
        synthetic.Stack(a, samples, leak[-1], history=leak),
        synthetic.Stack(b, 10, cache[-1], history=cache),
        synthetic.Stack(c, 5000, 5000 * 300, 4999, 4999 * 300, history=churn)], interval=1.0)
    rows = analysis.suspects(cap, min_age_s=60)
    assert [r["stack"] for r in rows] == [1, 2]  # the churn is not listed
    first, second = rows
    assert first["score"] > 0 and not first["plateaued"]
    assert first["late_growth_bytes_per_min"] == pytest.approx(6000, rel=0.01)  # 100 B/s
    assert "keep accumulating" in first["reasons"][0]
    assert second["plateaued"] and second["score"] == 0
    assert "plateaued" in second["reasons"][0]
    import numpy as np
    t = np.arange(6.0)
    y = np.where(t < 5, 2 * t, 100.0)  # one outlier among six samples of slope 2
    assert analysis.theil_sen(t, y) == pytest.approx(2)  # the median of pairwise slopes


def test_stacks_alike_up_to_jit_code_are_one_suspect(program):
    """A leak called from JIT-compiled code: each time the JIT compiles its caller again, the
    stack changes above the native frames, and each stack grows for a while, then holds (a JVM's
    Deflater under HotSpot). Alike up to their first frame in no file, they are one suspect,
    growing, first; a stack that differs below the JIT code stays apart."""
    site = synthetic.return_addresses(program, "framed")[:2]
    other = synthetic.return_addresses(program, "frameless")[:1]
    jit = 0x7F00_0000_1000  # (code in no file)
    samples, third = 60, 20

    def part(k):  # grows 300 B per sample in its third, holds after
        return [300 * min(max(i + 1 - k * third, 0), third) for i in range(samples)]

    slow = [20 * (i + 1) for i in range(samples)]
    stacks = [synthetic.Stack(site + [jit + 64 * k, jit + 4096 + k], third, part(k)[-1],
                              history=part(k)) for k in range(3)]
    stacks.append(synthetic.Stack(other + [jit], samples, slow[-1], history=slow))
    cap = synthetic.make(program, stacks, interval=1.0)
    cap.meta["jit"] = {"runtime": "jvm", "perf_map": "", "entries": 0}  # (Session.jit_state)
    rows = analysis.suspects(cap, min_age_s=60)
    first = rows[0]
    assert first["stacks"] == 3 and first["outstanding_bytes"] == 3 * 300 * third
    assert first["score"] > 0 and not first["plateaued"]
    assert first["late_growth_bytes_per_min"] == pytest.approx(300 * 60, rel=0.05)
    assert "with 2 more stacks alike up to JIT-compiled code" in first["reasons"]
    assert [r["stacks"] for r in rows] == [3, 1] and rows[1]["stack"] == 4
    # A process without a JIT runtime: frames in no module are a walk's step through code
    # loaded after its rows were read, not JIT code; the stacks are one suspect all the same.
    del cap.meta["jit"]
    first = analysis.suspects(cap, min_age_s=60)[0]
    assert "with 2 more stacks alike up to code in no module" in first["reasons"], first


def test_python_callers_of_one_native_stack_are_not_jit_code(program):
    """A Python program's stacks: the same native frames, then each its own Python frames
    (words with the top bit set, in no module, as a JIT's code is). Python frames are named
    frames: each stack is a suspect of its own, none "alike up to JIT-compiled code"."""
    from memhook import _native
    site = synthetic.return_addresses(program, "framed")[:2]
    samples = 30
    grows = [100 * (i + 1) for i in range(samples)]
    stacks = [synthetic.Stack(site + [_native.PYTHON_FRAME | (k + 1) << 32 | 2 * k],
                              samples, grows[-1], history=grows) for k in range(3)]
    rows = analysis.suspects(synthetic.make(program, stacks, interval=1.0), min_age_s=60)
    assert [r["stacks"] for r in rows] == [1, 1, 1], rows
    assert not any("JIT" in reason for r in rows for reason in r["reasons"]), rows


def test_a_stack_holding_a_tenth_is_never_left_out_unsaid(program):
    """A request in flight as the capture ended holds a third of the bytes (churn: no
    suspect), and two large stacks that hold without growing rank below ten growing ones: each
    is named as not a suspect, with why; a small churn stack is not."""
    at = synthetic.return_addresses(program, "framed")[0]  # (stacks told apart by address)
    samples = 20
    grow = [10 * (i + 1) for i in range(samples)]
    stacks = [synthetic.Stack([at + k], samples, grow[-1], history=grow) for k in range(10)]
    stacks.append(synthetic.Stack([at + 20], 1, 40000, history=[40000] * samples))
    stacks.append(synthetic.Stack([at + 21], 1, 30000, history=[30000] * samples))
    flight = [60000 if i % 2 else 0 for i in range(samples - 1)] + [60000]
    stacks.append(synthetic.Stack([at + 22], 400, 400 * 60000, 399, 399 * 60000,
                                  history=flight))
    small = [300 if i % 2 else 0 for i in range(samples - 1)] + [300]
    stacks.append(synthetic.Stack([at + 23], 400, 400 * 300, 399, 399 * 300, history=small))
    cap = synthetic.make(program, stacks, interval=1.0)
    churn = []
    ranked = analysis.suspects(cap, min_age_s=60, churn=churn)
    out = analysis.left_out(cap, ranked, 10, churn)
    assert [(r["stack"], r["outstanding_bytes"]) for r in out] == [(13, 60000), (11, 40000),
                                                                   (12, 30000)]
    assert out[0]["why"].startswith("churn: 399 of its 400 allocations freed")
    assert out[1]["why"] == "suspect #11, below the 10 the report lists"
