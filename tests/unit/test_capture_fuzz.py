"""The capture reader against hostile files: random bytes, truncations and mutations of a real
capture. Every outcome is a Capture whose report builds, or a CaptureError; nothing else, and
nothing that hangs. Bounded in examples and time."""
import json
import zlib

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memhook import capture
from memhook.reporters import collapsed, model, text
from memhook.symbolize import Symbolizer

FUZZ = settings(max_examples=300, deadline=2000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def sample_capture() -> bytes:
    frames = np.array([0x1000, 0x2000, 0x3000, 0x1000], np.uint64)
    sites = {k: np.array([0, 3, 1], np.uint64) for k in capture.SITE_COLUMNS}
    cap = capture.Capture({"pid": 1, "command": "x", "duration_s": 1.0, "totals": {}},
                          [{"path": "/nonexistent", "build_id": "ab", "bias": 0, "lo": 0x1000,
                            "hi": 0x4000}], sites, np.array([0, 0, 3, 4], np.uint64), frames,
                          {k: np.array([1.0]) for k in capture.SERIES_COLUMNS}, None, True)
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".mh") as f:
        capture.write(f.name, cap)
        return f.read()


VALID = sample_capture()


def read_and_report(tmp_path, data: bytes) -> None:
    path = tmp_path / "fuzz.mh"
    path.write_bytes(data)
    try:
        cap = capture.read(str(path))
    except capture.CaptureError as e:
        assert "\n" not in str(e)
        return
    rep = model.build(cap, Symbolizer(cap.modules, tool="pyelftools"))
    json.dumps(rep)
    text.render_text(rep)
    collapsed.render_collapsed(rep)


def test_the_sample_is_valid(tmp_path):
    read_and_report(tmp_path, VALID)
    path = tmp_path / "ok.mh"
    path.write_bytes(VALID)
    assert capture.read(str(path)).complete


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes(tmp_path, data):
    read_and_report(tmp_path, data)


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes_after_a_valid_header(tmp_path, data):
    read_and_report(tmp_path, VALID[:capture.HEADER.size] + data)


@FUZZ
@given(st.integers(0, len(VALID)))
def test_truncated(tmp_path, cut):
    read_and_report(tmp_path, VALID[:cut])


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=8))
def test_mutated(tmp_path, edits):
    data = bytearray(VALID)
    for at, value in edits:
        data[at] = value
    read_and_report(tmp_path, bytes(data))


def block(kind: bytes, payload: bytes) -> bytes:
    data = zlib.compress(payload)
    return capture.BLOCK.pack(kind, zlib.crc32(data), len(data)) + data


@FUZZ
@given(st.sampled_from([b"META", b"MODS", b"STKS", b"AGGR", b"AGGD", b"TSER", b"EVTS", b"BEHV",
                        b"LIVE", b"PYCO", b"PMAP"]),
       st.binary(max_size=2048))
def test_well_framed_garbage_blocks(tmp_path, kind, payload):
    """Checksums right, contents wrong: the block decoders must refuse, not crash."""
    head = VALID[:capture.HEADER.size]
    read_and_report(tmp_path, head + block(b"META", b'{"pid": 1}') + block(kind, payload))


@FUZZ
@given(st.dictionaries(st.sampled_from(capture.SITE_COLUMNS + capture.UNCERTAIN_COLUMNS
                                       + ("id", "first", "offsets", "frames")
                                       + capture.BEHAVIOUR_ROWS + capture.BEHAVIOUR_PAIRS
                                       + capture.LIVE_COLUMNS),
                       st.lists(st.integers(0, 2**64 - 1), max_size=6), max_size=12),
       st.sampled_from([b"STKS", b"AGGR", b"AGGD", b"TSER", b"BEHV", b"LIVE"]))
def test_array_blocks_with_wrong_shapes(tmp_path, arrays, kind):
    import io
    buf = io.BytesIO()
    np.savez(buf, **{k: np.array(v, np.uint64) for k, v in arrays.items()})
    head = VALID[:capture.HEADER.size]
    read_and_report(tmp_path, head + block(b"META", b'{"pid": 1}') + block(kind, buf.getvalue()))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["pid", "totals", "path", "lo", "hi",
                                                       "bias", "build_id", "command",
                                                       "duration_s", "alloc_count"]) | st.text(
                                                           max_size=4), inner, max_size=6),
                    max_leaves=20)


@FUZZ
@given(JSON, JSON)
def test_json_blocks_of_any_shape(tmp_path, meta, modules):
    head = VALID[:capture.HEADER.size]
    rest = VALID[capture.HEADER.size:]
    read_and_report(tmp_path, head + block(b"META", json.dumps(meta).encode())
                    + block(b"MODS", json.dumps(modules).encode()) + rest[:0]
                    + block(b"META", json.dumps({"totals": meta}).encode())
                    + block(b"PYCO", json.dumps(meta).encode())
                    + block(b"PMAP", json.dumps(modules).encode()))


def test_format_spec_names_what_the_code_writes():
    """docs/capture-format.md is the one description: every column the writer puts in a block
    is named in that block's row, and every block kind the reader knows has a row."""
    import re
    from pathlib import Path
    spec = (Path(__file__).parents[2] / "docs" / "capture-format.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+ ?)` \| (.*)$", spec, re.M)}
    assert set(rows) == {"META", "MODS", "STKS", "AGGR", "AGGD", "TSER", "EVTS", "BEHV", "LIVE",
                         "SNAP", "PROC", "PYCO", "PMAP", "END "}
    assert '`{"index": N}`' in rows["PROC"]
    sites = capture.SITE_COLUMNS + capture.UNCERTAIN_COLUMNS
    columns = {"AGGR": sites, "AGGD": ("id",) + sites,
               "TSER": capture.SERIES_COLUMNS + capture.MEMORY_COLUMNS,
               "LIVE": capture.LIVE_COLUMNS,
               "BEHV": capture.BEHAVIOUR_ROWS + capture.BEHAVIOUR_HISTS
               + capture.BEHAVIOUR_LATER_HISTS + capture.BEHAVIOUR_PAIRS,
               "EVTS": tuple(n for n in capture.EVENT_DTYPE.names if n != "pad"),
               "SNAP": ("meta_json", "id") + capture.SITE_COLUMNS}
    for kind, names in columns.items():
        missing = [n for n in names if f"`{n}`" not in rows[kind]]
        assert not missing, (kind, missing)
