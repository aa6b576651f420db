"""Lifetimes that can be true: blocks freed after delays the target measures itself land in
the bucket of what it measured, and none is shown finer than its events' timing allows."""
from __future__ import annotations

import json

import numpy as np

import pytest

from conftest import Memhook, build, run_memhook

# Lifetimes are timed: measured with no other test beside them.
pytestmark = pytest.mark.serial

from memhook import capture as capture_mod
from memhook.symbolize import Symbolizer

RESOLVED_FROM = 10  # bucket 10 = [1024, 2048) ns: nothing shorter is claimed


def measured_lifetimes(target, command: str) -> list[int]:
    target.proc.stdin.write(command + "\n")
    target.proc.stdin.flush()
    out = []
    while True:
        line = target.expect("")
        if line.startswith("done"):
            return out
        if line.startswith("life "):
            out.append(int(line.split()[1]))


def session(tmp_path, targets, command: str):
    target = targets(build(tmp_path, "lifetimes.c", base_flags=["-O2", "-g",
                                                                 "-fno-omit-frame-pointer"]))
    mh = Memhook(target.pid, tmp_path, "--ring-size", "32MiB")  # the waits allocate fast
    lives = measured_lifetimes(target, command)
    mh.stop()
    cap = capture_mod.read(str(mh.capture))
    sym = Symbolizer(cap.modules)
    stack = next(s for s in range(1, cap.stack_count)
                 if sym.frame(int(cap.frames(s)[0])).function == "timed_block")
    return mh, lives, cap, stack


def bucket(ns: int) -> int:
    return int(ns).bit_length() - 1


def matched(measured: list[int], resolved: np.ndarray, under: np.ndarray) -> list[int]:
    """Checks memhook's buckets against the target's measures: every lifetime memhook counted
    in a bucket is one the target measured there, and every bound it gave instead covers a
    measured lifetime not already matched (the longest bounds the longest). Returns the bounds'
    buckets."""
    measured = sorted(bucket(x) for x in measured)
    for i in np.nonzero(resolved)[0]:
        for _ in range(int(resolved[i])):
            assert int(i) in measured, (int(i), measured)
            measured.remove(int(i))
    bounds = sorted(int(i) for i in np.nonzero(under)[0] for _ in range(int(under[i])))
    assert len(bounds) == len(measured) and all(b >= m for b, m in zip(bounds, measured)), \
        (bounds, measured)
    return bounds


def test_busy_thread_lifetimes_land_in_their_buckets(tmp_path, targets):
    """A thread that keeps allocating at a steady pace while it waits (12 µs to 96 ms): each
    block's lifetime is in the bucket of the target's own measure, or, where memhook cannot
    tell the thread's waiting from its working that finely, "under" a bound that covers it:
    never in a wrong bucket. The transient count at the default threshold (1 ms) is the
    target's own, less the blocks known only under a longer bound."""
    mh, lives, cap, stack = session(tmp_path, targets, "busy")
    assert len(lives) == 25
    resolved = cap.behaviour["lifetime_hist"][stack].astype(int)
    under = cap.behaviour["lifetime_unresolved_hist"][stack].astype(int)
    assert cap.meta["totals"]["dropped_events"] == 0
    bounds = matched(lives, resolved, under)
    # How many are timed finely enough depends on how steadily the machine runs the thread
    # (benchmarks/lifetimes.py measures it: 4 of 25 under a bound on a quiet VM, 13 beside a
    # CPU hog on a slow one); the long ones always are, and some shorter ones: the busy
    # thread's anchors time them.
    assert resolved[bucket(96_000_000)] == 5, (bounds, sorted(lives))
    assert len(bounds) < 20, ("no lifetime under 96 ms was timed", bounds, sorted(lives))
    rep = json.loads(run_memhook("report", mh.capture, "--format", "json").stdout)
    row = next(r for r in rep["transient"] if r["frames"][0]["function"] == "timed_block")
    quick = sum(x < 1_000_000 for x in lives)  # 15, unless the machine stalled the target
    assert quick - len(bounds) <= row["transient_count"] <= quick, (row, bounds)


def test_quiet_thread_lifetimes_are_never_finer_than_their_timing(tmp_path, targets):
    """A thread that sleeps while it waits: its events are timed only by the consumer's looks
    at the ring, so short lifetimes are known only to lie under a bound. Every lifetime counted
    in a bucket is in the right one; every other lies under its bound; none under 1 µs is
    claimed anywhere in the capture (the old "1 ns" bucket)."""
    mh, lives, cap, stack = session(tmp_path, targets, "sleep")
    b = cap.behaviour
    resolved = b["lifetime_hist"][stack].astype(int)
    under = b["lifetime_unresolved_hist"][stack].astype(int)
    assert resolved.sum() + under.sum() == 25
    matched(lives, resolved, under)
    assert b["lifetime_hist"][:, :RESOLVED_FROM].sum() == 0
    assert resolved[bucket(96_000_000)] == 5  # long sleeps are long whatever the drains
