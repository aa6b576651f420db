"""Code objects' records (CodeRecord, common/segment.h): what the hooks copied of each Python
code object the first time they met it, read from the code area as the session goes and kept in
the capture (PYCO blocks), so that Python frames are named offline, by their record's number
(its offset in the area / 8 + 1)."""
from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

from .. import _native

HEADER = struct.Struct("<IIQiBBBBIIII")
assert HEADER.size == _native.CODE_RECORD_BYTES
CODECS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}
# A Python frame's word (common/record_format.h): its flag, and where its record's number lies.
PYTHON_FRAME = _native.PYTHON_FRAME
CODE_SHIFT = _native.PYTHON_CODE_SHIFT
CODE_MASK = (1 << 30) - 1


@dataclass(frozen=True)
class CodeObject:
    name: str        # qualified name (3.11 on), the function's name before
    file: str
    firstlineno: int
    minor: int       # the CPython version's minor number: the line table's format
    linetable: bytes
    cut: bool = False  # the line table was cut short (kMaxCodeTable)


def _text(raw: bytes, kind: int) -> str:
    return raw.decode(CODECS.get(kind, "latin-1"), errors="replace")


def parse(raw: bytes, first: int, into: dict) -> int:
    """Add the records in `raw` (the area's bytes from offset `first` on) to `into`, by number.
    Returns the offset after the last whole record. Malformed bytes end the reading."""
    at = 0
    while at + HEADER.size <= len(raw):
        (size, flags, _code, firstlineno, name_kind, file_kind, minor, _, name_bytes,
         file_bytes, table_bytes, _) = HEADER.unpack_from(raw, at)
        body = HEADER.size + name_bytes + file_bytes + table_bytes
        if size < HEADER.size or size % 8 or body > size or at + size > len(raw):
            break
        o = at + HEADER.size
        name = raw[o:o + name_bytes]
        file = raw[o + name_bytes:o + name_bytes + file_bytes]
        table = raw[o + name_bytes + file_bytes:o + body - HEADER.size]
        into[(first + at) // 8 + 1] = CodeObject(
            _text(name, name_kind), _text(file, file_kind), firstlineno, minor, bytes(table),
            bool(flags & _native.CODE_TABLE_CUT))
        at += size
    return first + at


def read_new(session) -> dict:
    """The records the hooks completed since the last call, also kept in the session's
    `python_code`."""
    if session.python is None or session.python.layout is None or session.segment is None:
        return {}
    raw, _ = session.consumer.code_records(session.code_read)
    new: dict = {}
    session.code_read = parse(raw, session.code_read, new)
    session.python_code.update(new)
    return new


def to_json(records: dict) -> dict:
    """A PYCO block's value: the records by number."""
    return {"records": [[n, c.name, c.file, c.firstlineno, c.minor,
                         base64.b64encode(c.linetable).decode(), c.cut]
                        for n, c in records.items()]}


def from_json(value, into: dict) -> None:
    try:
        if not isinstance(value, dict):
            raise ValueError
        for n, name, file, firstlineno, minor, table, cut in value["records"]:
            if not (isinstance(n, int) and isinstance(name, str) and isinstance(file, str)
                    and isinstance(firstlineno, int) and isinstance(minor, int)
                    and isinstance(table, str) and 0 < n < 1 << 30):
                raise ValueError
            into[n] = CodeObject(name, file, firstlineno, minor,
                                 base64.b64decode(table, validate=True), bool(cut))
    except (KeyError, TypeError, ValueError):
        raise ValueError("code record block malformed") from None
