"""The recorder of a live session: what it holds for the final report and what it writes."""
import os
import types

import numpy as np

from memhook import capture
from memhook.capture import recorder
from memhook.reporters import analysis


def test_live_series_stays_bounded(monkeypatch):
    """A session of days: the series a live session holds for its final report is halved in
    resolution whenever it holds more than MAX_TICKS samples or MAX_CHANGES per-stack changes
    (here made small), and still gives every stack its latest outstanding bytes. (A unit test:
    the consumer is a stand-in that changes 40 of 2,000 stacks per sample.)"""
    monkeypatch.setattr(recorder, "MAX_TICKS", 64)
    monkeypatch.setattr(recorder, "MAX_CHANGES", 5_000)
    rng = np.random.default_rng(1)
    out = np.zeros(2000, np.uint64)

    def sites():
        out[rng.integers(1, 2000, 40)] += np.uint64(7)
        return {"outstanding_bytes": out.copy()}
    consumer = types.SimpleNamespace(
        totals=lambda: {k: 0 for k in capture.SERIES_COLUMNS[1:]}, sites=sites, drain=lambda: 0)
    rec = capture.Recorder(types.SimpleNamespace(consumer=consumer, pid=os.getpid(), python=None,
                                                 perf_map=None, target_alive=lambda: False))
    for _ in range(3000):
        rec.tick()
        assert len(rec.ticks) <= 64 and rec.held <= 5_000 + 40
    series = rec.held_series()
    times, per_stack = analysis.stack_series(capture.Capture(series=series))
    assert len(times) <= 64 and list(times) == sorted(times)
    assert all(per_stack[s][-1] == out[s] for s in np.flatnonzero(out)), "a stack's last value"


def test_recent_values_of_a_stack_are_its_samples():
    """The live view's growth column reads the recorder's ticks (Recorder.recent): a stack's
    outstanding bytes at each of the last n samples, as the consumer had them then, whether
    or not it changed in that window."""
    values = {1: [0, 10, 10, 10, 30, 30, 30, 60, 60, 90], 2: [5] * 10,
              3: [0, 0, 0, 0, 0, 0, 0, 0, 7, 7]}
    tick = {"n": 0}

    def sites():
        out = np.zeros(4, np.uint64)
        for s, v in values.items():
            out[s] = v[tick["n"]]
        return {"outstanding_bytes": out}
    consumer = types.SimpleNamespace(
        totals=lambda: {k: 0 for k in capture.SERIES_COLUMNS[1:]}, sites=sites, drain=lambda: 0)
    rec = capture.Recorder(types.SimpleNamespace(consumer=consumer, pid=os.getpid(), python=None,
                                                 perf_map=None, target_alive=lambda: False))
    for n in range(10):
        tick["n"] = n
        rec.tick()
    for window in (1, 4, 10):
        times, series = rec.recent([1, 2, 3], window)
        assert len(times) == window and list(times) == sorted(times)
        for s, v in values.items():
            assert series[s].tolist() == v[-window:], (s, window)
