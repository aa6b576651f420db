"""A Python code object's line at an instruction's byte offset, from the line table the hooks
copied (capture/python_code.py), in each version's own format, as PyCode_Addr2Line reads it:
co_lnotab (3.8, 3.9), co_linetable's pairs (3.10), the location table (3.11 on,
CPython's Objects/locations.md). None where the table gives no line."""
from __future__ import annotations

import bisect
import functools


def _lnotab(table: bytes, first: int) -> tuple[list, list]:
    """3.8, 3.9: (address increment, signed line increment) byte pairs; an instruction's line
    is the first line plus the increments of every pair whose address it has reached."""
    line, addr, starts, lines = first, 0, [0], [first]
    for i in range(0, len(table) - 1, 2):
        addr += table[i]
        d = table[i + 1]
        line += d - 256 if d >= 128 else d
        starts.append(addr)
        lines.append(line)
    return starts, lines


def _pairs_3_10(table: bytes, first: int) -> tuple[list, list]:
    """3.10: (byte delta of the range's end, signed line delta; -128: no line) pairs, each
    a range of instructions."""
    line, end, ends, lines = first, 0, [], []
    for i in range(0, len(table) - 1, 2):
        end += table[i]
        d = table[i + 1]
        if d != 128:
            line += d - 256 if d > 128 else d
        if table[i]:  # (an empty range holds no instruction, but its delta counts)
            ends.append(end)
            lines.append(None if d == 128 else line)
    return ends, lines


def _varint(table: bytes, i: int) -> tuple[int, int]:
    b = table[i]
    value, shift = b & 63, 6
    while b & 64:
        i += 1
        b = table[i]
        value |= (b & 63) << shift
        shift += 6
    return value, i + 1


def _svarint(table: bytes, i: int) -> tuple[int, int]:
    v, i = _varint(table, i)
    return (-(v >> 1) if v & 1 else v >> 1), i


def _locations(table: bytes, first: int) -> tuple[list, list]:
    """3.11 on: entries of 1 to 8 code units, each its first byte (1, code (4 bits),
    units - 1 (3 bits)) and the code's data. A table cut short gives the entries before the
    cut."""
    line, addr, i, ends, lines = first, 0, 0, [], []
    try:
        while i < len(table):
            head = table[i]
            code, units = (head >> 3) & 15, (head & 7) + 1
            i += 1
            known = True
            if code == 15:  # no location
                known = False
            elif code == 14:  # long form: line delta, end line delta, columns
                delta, i = _svarint(table, i)
                line += delta
                for _ in range(3):
                    _, i = _varint(table, i)
            elif code == 13:  # no columns
                delta, i = _svarint(table, i)
                line += delta
            elif code >= 10:  # one line: its delta in the code, two column bytes
                line += code - 10
                i += 2
            else:  # short form: the same line, one column byte
                i += 1
            addr += 2 * units
            ends.append(addr)
            lines.append(line if known else None)
    except IndexError:
        pass
    return ends, lines


# A report looks up many offsets of few code objects: each table is decoded once, into the
# ends of its ranges (sorted) and their lines. (bytes cache their hash: the key is cheap.)
@functools.lru_cache(maxsize=8192)
def _decoded(minor: int, table: bytes, first: int) -> tuple[bool, list, list]:
    if minor <= 9:
        return (True, *_lnotab(table, first))
    return (False, *(_pairs_3_10 if minor == 10 else _locations)(table, first))


def line_at(minor: int, table: bytes, first: int, offset: int) -> int | None:
    """The line of the instruction at byte `offset` of a code object of CPython 3.minor."""
    by_start, bounds, lines = _decoded(minor, table, first)
    if by_start:  # (co_lnotab: the last increment the offset has reached)
        return lines[bisect.bisect_right(bounds, offset) - 1] if offset >= 0 else first
    i = bisect.bisect_right(bounds, offset)  # the first range ending after it
    return lines[i] if offset >= 0 and i < len(lines) else None
