"""The capture file: what is written is read back, a file cut off reads up to its last complete
block, and one file holds several processes (docs/capture-format.md)."""
from __future__ import annotations

import numpy as np
import pytest

import synthetic
from memhook import capture


@pytest.fixture(scope="module")
def cap(tmp_path_factory):
    program = synthetic.compile_program(tmp_path_factory.mktemp("program"))
    a = synthetic.return_addresses(program, "framed")[:1] + \
        synthetic.return_addresses(program, "main")[:1]
    return synthetic.make(program, [synthetic.Stack(a, 4, 400, 1, 100, history=[100, 200, 300])])


def same(x: capture.Capture, y: capture.Capture) -> None:
    assert x.meta == y.meta and x.modules == y.modules
    assert x.stack_offsets.tolist() == y.stack_offsets.tolist()
    assert x.stack_frames.tolist() == y.stack_frames.tolist()
    for k in capture.SITE_COLUMNS + capture.UNCERTAIN_COLUMNS:
        assert x.sites[k].tolist() == y.sites[k].tolist(), k
    for k, v in x.series.items():
        assert np.asarray(v).tolist() == np.asarray(y.series[k]).tolist(), k


def test_written_then_read(tmp_path, cap):
    path = tmp_path / "a.mh"
    capture.write(str(path), cap)
    back = capture.read(str(path))
    assert back.complete
    same(cap, back)


def test_cut_off_reads_its_complete_blocks(tmp_path, cap):
    path = tmp_path / "a.mh"
    capture.write(str(path), cap)
    data = path.read_bytes()
    cut = tmp_path / "cut.mh"
    cut.write_bytes(data[:-9])  # the END block and a little more
    back = capture.read(str(cut))
    assert not back.complete
    assert back.meta == cap.meta and back.stack_count == cap.stack_count


def test_one_file_several_processes(tmp_path, cap):
    path = tmp_path / "fleet.mh"
    shared = capture.SharedWriter(str(path))
    for index, pid in enumerate((11, 22)):
        w = shared.process(index)
        w.json(b"META", {**cap.meta, "pid": pid})
        w.json(b"MODS", cap.modules)
        w.arrays(b"STKS", first=np.array(0, np.uint64), offsets=cap.stack_offsets,
                 frames=cap.stack_frames)
        w.arrays(b"AGGR", **cap.sites)
        w.close()  # (a process's writer leaves the file open for the others)
    shared.close()
    procs = capture.read_processes(str(path))
    assert [p.meta["pid"] for p in procs] == [11, 22]
    merged = capture.read(str(path))
    assert [p.meta["pid"] for p in merged.processes] == [11, 22]
    assert int(merged.sites["outstanding_bytes"][1]) == 2 * 300


def test_snapshots_written_read_and_reported_on(tmp_path, cap):
    """SNAP blocks come back in order, and a capture at a snapshot holds that snapshot's
    aggregates and totals, and its series up to that moment; an absent number is a KeyError."""
    import dataclasses
    from memhook.capture import snapshots
    n = cap.stack_count
    first = {k: np.zeros(n, np.uint64) for k in capture.SITE_COLUMNS}
    first["alloc_count"][1] = first["outstanding_count"][1] = 3
    first["alloc_bytes"][1] = first["outstanding_bytes"][1] = 300
    infos = [{"number": 1, "time_s": 0.5, "reason": "asked", "totals": {"alloc_count": 3},
              "rss_bytes": 4096}]
    snaps = [{**infos[0], "sites": {"id": np.array([1]),
                                    **{k: v[[1]] for k, v in first.items()}}}]
    with_snaps = dataclasses.replace(cap, snapshots=snaps)
    path = tmp_path / "snaps.mh"
    capture.write(str(path), with_snaps)
    back = capture.read(str(path))
    assert [(s["number"], s["reason"], s["rss_bytes"]) for s in back.snapshots] == \
        [(1, "asked", 4096)]
    at = snapshots.at(back, 1)
    assert at.sites["outstanding_bytes"].tolist() == first["outstanding_bytes"].tolist()
    assert at.meta["totals"]["alloc_count"] == 3 and at.meta["duration_s"] == 0.5
    assert all(t <= 0.5 for t in at.series.get("time_s", []))
    assert snapshots.listing(back) == [{"number": 1, "time_s": 0.5, "reason": "asked",
                                        "outstanding_bytes": 300, "outstanding_count": 3,
                                        "rss_bytes": 4096}]
    with pytest.raises(KeyError):
        snapshots.at(back, 2)


def test_behaviour_histograms_written_sparse_and_read_either_way(tmp_path, cap):
    """BEHV holds each histogram's non-zero counts (NAME_at, NAME_count); a capture reads back
    the same dense rows, and so does one written dense (as older captures were); an index past
    the stacks is a damaged block, one line."""
    import dataclasses
    import io
    import struct
    import zlib
    rows = cap.stack_count  # (its stack_offsets hold the "no stack" row 0 too)
    rng = np.random.default_rng(5)
    b = {k: rng.integers(0, 9, rows).astype(np.uint64) for k in capture.BEHAVIOUR_ROWS}
    for k in capture.BEHAVIOUR_HISTS + capture.BEHAVIOUR_LATER_HISTS:
        dense = np.zeros((rows, 48), np.uint64)
        dense[rng.integers(0, rows, 6), rng.integers(0, 48, 6)] = rng.integers(1, 2**40, 6)
        b[k] = dense
    b.update({k: np.array([0], np.uint64) for k in capture.BEHAVIOUR_PAIRS})
    with_b = dataclasses.replace(cap, behaviour=b)
    path = tmp_path / "sparse.mh"
    capture.write(str(path), with_b)
    data = path.read_bytes()
    at = data.index(b"BEHV")
    _, _, length = struct.unpack_from("<4sIQ", data, at)
    held = np.load(io.BytesIO(zlib.decompress(data[at + 16:at + 16 + length])))
    assert "size_hist_at" in held.files and "size_hist" not in held.files
    assert len(held["size_hist_at"]) == np.count_nonzero(b["size_hist"])

    def hists(c):
        return {k: c.behaviour[k].tolist() for k in capture.BEHAVIOUR_HISTS
                + capture.BEHAVIOUR_LATER_HISTS}
    assert hists(capture.read(str(path))) == hists(with_b)
    old = tmp_path / "dense.mh"
    w = capture.Writer(str(old))
    w.json(b"META", cap.meta)
    w.json(b"MODS", cap.modules)
    w.arrays(b"STKS", first=np.array(0, np.uint64), offsets=cap.stack_offsets,
             frames=cap.stack_frames)
    w.arrays(b"AGGR", **cap.sites)
    w.arrays(b"BEHV", **b)
    w.close()
    assert hists(capture.read(str(old))) == hists(with_b)
    bad = dict(b, size_hist=np.zeros((rows + 5, 48), np.uint64))
    bad["size_hist"][rows + 4, 3] = 1  # (a count for a stack past the rows)
    w = capture.Writer(str(old))
    w.json(b"META", cap.meta)
    w.json(b"MODS", cap.modules)
    w.arrays(b"BEHV", **capture.format.sparse_hists(bad))
    w.close()
    with pytest.raises(capture.CaptureError, match="damaged 'BEHV' block"):
        capture.read(str(old))
