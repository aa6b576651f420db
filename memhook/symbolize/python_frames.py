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
    out, run = [], []
    for w in words:
        run.append(w)
        if w & _native.PYTHON_ENTRY:
            out.append(run)
            run = []
    if run:
        out.append(run)
    return out


def is_eval(d: dict) -> bool:
    fn = d.get("function") or ""
    return fn == EVAL or fn.startswith(EVAL + ".")


def named(words: list, code: dict, cache: dict) -> list:
    """The frames of Python frame words, each made once per word (`cache`; shared, as native
    frames' dicts are: reports only read them). A word whose code record has not come yet (a
    live session reads them as it goes) is named again next time."""
    out = []
    for w in words:
        d = cache.get(w)
        if d is None:
            d = frame_dict(w, code)
            if d["function"] != UNRECORDED:
                cache[w] = d
        out.append(d)
    return out


def interleave(native: list, words: list, code: dict, native_cut: bool,
               calls: list | None = None, cache: dict | None = None) -> list:
    """`native`: the native frames' dicts, innermost first; `words`: the Python frame words;
    `native_cut`: the native walk stopped at its depth (outer calls of the evaluator missing);
    `calls`: where in `native` the evaluator's frames are, if known."""
    if calls is None:
        calls = [i for i, d in enumerate(native) if is_eval(d)]
    cache = {} if cache is None else cache
    groups = runs(words)
    python_cut = len(words) >= _native.PYTHON_DEPTH
    if not (len(calls) == len(groups) or (native_cut and len(calls) < len(groups))
            or (python_cut and len(groups) < len(calls))):
        note = {"address": None, "module": None, "offset": None,
                "function": f"[Python frames: {len(groups)} calls of {EVAL} read, "
                            f"{len(calls)} in the native stack]",
                "file": None, "line": None, "kind": KIND}
        return native + [note] + named(words, code, cache)
    out, last = [], 0
    for i, group in zip(calls, groups):
        out += native[last:i]
        out += named(group, code, cache)
        last = i + 1
    out += native[last:]
    for group in groups[len(calls):]:  # beyond the native walk's depth
        out += named(group, code, cache)
    return out
