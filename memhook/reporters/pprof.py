"""A capture as a gzip-compressed pprof profile (github.com/google/pprof, proto/profile.proto),
with Go heap-profile sample types: alloc_objects, alloc_space, inuse_objects, inuse_space.

The protobuf wire format is written directly: the profile needs only varints, packed varints and
length-delimited fields, which is less than protobuf's runtime plus generated code would bring.
Go's own pprof reads the result (tests/integration/test_capture.py runs `go tool pprof` on it).
"""
from __future__ import annotations

import gzip

from ..capture import Capture
from ..common.format import LEAK_FRAME_LABEL, leak_frame
from ..symbolize import Symbolizer
from .model import SAMPLE_TYPES, lost_sample_type

# pprof's sample types: the model's, and each stack's outstanding bytes at the session's peak
# (0 in captures from before the peak).
PPROF_TYPES = SAMPLE_TYPES + (("peak_space", "bytes", "peak_bytes"),)


def sample_types(report: dict) -> tuple:
    return PPROF_TYPES + lost_sample_type(report)

MASK64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    n &= MASK64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, value: int) -> bytes:
    return _varint(num << 3) + _varint(value) if value else b""


def _message(num: int, body: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(body)) + body


def _packed(num: int, values) -> bytes:
    return _message(num, b"".join(_varint(v) for v in values))


class _Strings:
    def __init__(self):
        self.index = {"": 0}

    def __call__(self, s: str | None) -> int:
        if not s:
            return 0
        return self.index.setdefault(s, len(self.index))

    def encode(self) -> bytes:
        return b"".join(_message(6, s.encode()) for s in self.index)


def profile(cap: Capture, report: dict, symbolizer: Symbolizer) -> bytes:
    """The report's sites (already filtered) as a gzip-compressed profile.proto."""
    strings = _Strings()
    out = bytearray()
    types = sample_types(report)
    for name, unit, _ in types:
        out += _message(1, _field(1, strings(name)) + _field(2, strings(unit)))

    mappings: dict = {}  # module path -> mapping id
    for m in cap.modules:
        if m["path"] in mappings:
            continue
        mid = len(mappings) + 1
        mappings[m["path"]] = mid
        out += _message(3, _field(1, mid) + _field(2, m["lo"]) + _field(3, m["hi"])
                        + _field(5, strings(m["path"])) + _field(6, strings(m.get("build_id")))
                        + _field(7, 1) + _field(8, 1) + _field(9, 1) + _field(10, 1))

    functions: dict = {}  # (name, file) -> function id
    locations: dict = {}  # address -> location id
    body_locations = bytearray()
    body_functions = bytearray()

    def function_id(name: str | None, file: str | None) -> int:
        key = (name or "??", file or "")
        if key not in functions:
            functions[key] = len(functions) + 1
            body_functions.extend(_message(5, _field(1, functions[key])
                                           + _field(2, strings(key[0]))
                                           + _field(3, strings(key[0]))
                                           + _field(4, strings(key[1]))))
        return functions[key]

    def location_id(address: int) -> int:
        if address not in locations:
            lid = len(locations) + 1
            locations[address] = lid
            frames = symbolizer.frames(address)  # innermost first, as pprof's lines are
            lines = b"".join(_message(4, _field(1, function_id(f.function, f.file))
                                      + _field(2, f.line or 0)) for f in frames)
            mid = mappings.get(frames[-1].module or "", 0)
            body_locations.extend(_message(4, _field(1, lid) + _field(2, mid)
                                           + _field(3, address) + lines))
        return locations[address]

    samples = bytearray()
    for site in report["sites"]:
        # An inlined frame shares its location with the frames after it, up to the real one;
        # equal addresses in consecutive real frames are recursion, not inlining.
        addresses, inside = [], False
        for f in site["frames"]:
            if not inside:
                addresses.append(int(f["address"], 16))
            inside = bool(f.get("inlined"))
        ids = [location_id(a) for a in addresses]
        values = [site.get(key, 0) for _, _, key in types]
        label = _message(3, _field(1, strings(LEAK_FRAME_LABEL)) +
                         _field(2, strings(leak_frame(site))))  # (the frame to fix)
        samples += _message(2, _packed(1, ids) + _packed(2, values) + label)
    out += samples + body_locations + body_functions
    meta = cap.meta
    if meta.get("started_at"):
        out += _field(9, int(meta["started_at"] * 1e9))
    if meta.get("duration_s"):
        out += _field(10, int(meta["duration_s"] * 1e9))
    out += _message(11, _field(1, strings("space")) + _field(2, strings("bytes")))
    out += _field(14, strings("inuse_space"))
    out += strings.encode()  # last: every string above is interned by now
    return gzip.compress(bytes(out))


def render(cap: Capture, report: dict, symbolizer: Symbolizer, **_) -> bytes:
    return profile(cap, report, symbolizer)
