"""Python frames in a stack: the words the hooks appended after the native frames (common/
record_format.h), named from the code objects' records (capture/python_code.py), and put where
they ran: each native _PyEval_EvalFrameDefault frame (or its .cold part) is replaced by the
Python frames that call of it ran, innermost first, as memray's hybrid stacks and
`py-spy dump --native` show them. Where the counts disagree, the stack says so, keeps its native
frames, and lists the Python frames after a marker rather than guessing where each ran."""
from __future__ import annotations

from .. import _native
from ..capture.python_code import CODE_MASK
from .python_lines import line_at

EVAL = "_PyEval_EvalFrameDefault"
KIND = "python"
UNREADABLE = "[Python frames unreadable]"
UNRECORDED = "[Python code not recorded]"


def split(addresses: list) -> tuple[list, list]:
    """(native return addresses, Python frame words), each innermost first."""
    if not addresses or max(addresses) < _native.PYTHON_FRAME:  # (the flag is the top bit)
        return addresses, []
    for i, a in enumerate(addresses):
        if a & _native.PYTHON_FRAME:
            return addresses[:i], addresses[i:]
    return addresses, []


def frame_dict(word: int, code: dict) -> dict:
    """A Python frame as reports hold frames (Frame.as_dict's keys, and its kind)."""
    at = f"0x{word:x}"
    if word == _native.PYTHON_UNREADABLE:
        return {"address": at, "module": None, "offset": None, "function": UNREADABLE,
                "file": None, "line": None, "kind": KIND}
    c = code.get((word >> _native.PYTHON_CODE_SHIFT) & CODE_MASK)
    if c is None:
        return {"address": at, "module": None, "offset": None, "function": UNRECORDED,
                "file": None, "line": None, "kind": KIND}
    offset = word & 0xFFFFFFFF
    return {"address": at, "module": None, "offset": offset, "function": c.name,
            "file": c.file, "line": line_at(c.minor, c.linetable, c.firstlineno, offset),
            "kind": KIND}


def runs(words: list) -> list[list]:
    """The Python frames by the call of _PyEval_EvalFrameDefault that ran them, innermost
    first: a run ends with the frame the hooks marked as its first (kPythonEntry). A last run
    not so marked was cut short (the depth Python frames are read to)."""
    return [words[a:b] for a, b in _bounds(words)]


def _bounds(words: list) -> list[tuple[int, int]]:
    """runs() as (start, end) pairs into words."""
    entry = _native.PYTHON_ENTRY
    ends = [i + 1 for i, w in enumerate(words) if w & entry]
    if not ends or ends[-1] != len(words):
        ends.append(len(words))
    return list(zip([0] + ends[:-1], ends))


def is_eval(d: dict) -> bool:
    fn = d.get("function") or ""
    return fn == EVAL or fn.startswith(EVAL + ".")


def named(words: list, code: dict, cache: dict) -> list:
    """The frames of Python frame words, each made once per word (`cache`; shared, as native
    frames' dicts are: reports only read them). A word whose code record has not come yet (a
    live session reads them as it goes) is named again next time. (One lookup a word in C: a
    report of 349,000 Python stacks named 4.5 M words.)"""
    out = list(map(cache.get, words))
    if None in out:
        for i, d in enumerate(out):
            if d is None:
                d = out[i] = frame_dict(words[i], code)
                if d["function"] != UNRECORDED:
                    cache[words[i]] = d
    return out


def interleave(native: list, words: list, code: dict, native_cut: bool,
               calls: list | None = None, cache: dict | None = None) -> list:
    """`native`: the native frames' dicts, innermost first; `words`: the Python frame words;
    `native_cut`: the native walk stopped at its depth (outer calls of the evaluator missing);
    `calls`: where in `native` the evaluator's frames are, if known."""
    if calls is None:
        calls = [i for i, d in enumerate(native) if is_eval(d)]
    cache = {} if cache is None else cache
    bounds = _bounds(words)
    python_cut = len(words) >= _native.PYTHON_DEPTH
    frames = named(words, code, cache)
    if not (len(calls) == len(bounds) or (native_cut and len(calls) < len(bounds))
            or (python_cut and len(bounds) < len(calls))):
        note = {"address": None, "module": None, "offset": None,
                "function": f"[Python frames: {len(bounds)} calls of {EVAL} read, "
                            f"{len(calls)} in the native stack]",
                "file": None, "line": None, "kind": KIND}
        return native + [note] + frames
    out, last = [], 0
    for i, (a, b) in zip(calls, bounds):
        out += native[last:i]
        out += frames[a:b]
        last = i + 1
    out += native[last:]
    if len(bounds) > len(calls):  # beyond the native walk's depth
        out += frames[bounds[len(calls)][0]:]
    return out
