"""Capture files: what a session saw, raw (return addresses, not symbols), to report on later,
on this host or another.

Layout: a 24-byte header (magic, format version), then blocks, each
  kind (4 bytes) | crc32 of payload (u32) | payload length (u64) | zlib-compressed payload
Kinds: META (JSON), MODS (JSON module table), ARRY (one named numpy array in .npy format),
END  (marks a complete file). Blocks are appended as they are produced, so a capture cut off by
a crash is readable up to its last complete block.
"""
from __future__ import annotations

import io
import json
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"MEMHOOK\0CAPTURE\0"
VERSION = 1
HEADER = struct.Struct("<16sII")
BLOCK = struct.Struct("<4sIQ")
MAX_BLOCK = 1 << 34


class CaptureError(Exception):
    """A capture file that cannot be read, with a one-line reason."""


@dataclass
class Capture:
    meta: dict = field(default_factory=dict)
    modules: list = field(default_factory=list)  # dicts: path, build_id, bias, lo, hi
    arrays: dict = field(default_factory=dict)
    complete: bool = False


class Writer:
    def __init__(self, path: str):
        self._f = open(path, "wb")
        self._f.write(HEADER.pack(MAGIC, VERSION, 0))

    def _block(self, kind: bytes, payload: bytes) -> None:
        data = zlib.compress(payload, 6)
        self._f.write(BLOCK.pack(kind, zlib.crc32(data), len(data)) + data)
        self._f.flush()

    def meta(self, meta: dict) -> None:
        self._block(b"META", json.dumps(meta).encode())

    def modules(self, modules: list) -> None:
        self._block(b"MODS", json.dumps(modules).encode())

    def array(self, name: str, value: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(value), allow_pickle=False)
        raw = name.encode()
        self._block(b"ARRY", struct.pack("<H", len(raw)) + raw + buf.getvalue())

    def close(self) -> None:
        self._block(b"END ", b"")
        self._f.close()


def write(path: str, capture: Capture) -> None:
    w = Writer(path)
    w.meta(capture.meta)
    w.modules(capture.modules)
    for name, value in capture.arrays.items():
        w.array(name, value)
    w.close()


def read(path: str) -> Capture:
    try:
        f = open(path, "rb")
    except OSError as e:
        raise CaptureError(f"cannot open {path}: {e.strerror}") from None
    with f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise CaptureError(f"{path} is not a memhook capture (too short)")
        magic, version, _ = HEADER.unpack(head)
        if magic != MAGIC:
            raise CaptureError(f"{path} is not a memhook capture (bad magic)")
        if version != VERSION:
            raise CaptureError(f"{path} is capture format {version}; this memhook reads "
                               f"format {VERSION}")
        cap = Capture()
        while True:
            hdr = f.read(BLOCK.size)
            if len(hdr) < BLOCK.size:
                break  # cut off: keep what was complete
            kind, crc, length = BLOCK.unpack(hdr)
            if length > MAX_BLOCK:
                break
            data = f.read(length)
            if len(data) < length or zlib.crc32(data) != crc:
                break
            try:
                payload = zlib.decompress(data)
                _apply(cap, kind, payload)
            except (zlib.error, ValueError, UnicodeDecodeError, struct.error) as e:
                raise CaptureError(f"{path}: damaged {kind!r} block ({e})") from None
            if kind == b"END ":
                cap.complete = True
                break
    if not cap.meta:
        raise CaptureError(f"{path} holds no complete metadata block")
    return cap


def _apply(cap: Capture, kind: bytes, payload: bytes) -> None:
    if kind == b"META":
        cap.meta = json.loads(payload)
    elif kind == b"MODS":
        cap.modules = json.loads(payload)
    elif kind == b"ARRY":
        (n,) = struct.unpack_from("<H", payload)
        name = payload[2:2 + n].decode()
        cap.arrays[name] = np.load(io.BytesIO(payload[2 + n:]), allow_pickle=False)
