"""Python frames in a stack (symbolize/python_frames.py): each _PyEval_EvalFrameDefault call
replaced by the Python frames it ran, runs told by the frame that began each; a stack whose
counts disagree says so and keeps its native frames."""
from memhook import _native
from memhook.capture.python_code import CodeObject
from memhook.symbolize import python_frames as pf

CODE = {1: CodeObject("inner", "/srv/a.py", 10, 11, b""),
        2: CodeObject("outer", "/srv/a.py", 1, 11, b""),
        3: CodeObject("<module>", "/srv/a.py", 1, 11, b"")}


def word(record: int, entry: bool = False, offset: int = 0) -> int:
    return _native.PYTHON_FRAME | (_native.PYTHON_ENTRY if entry else 0) | \
        record << _native.PYTHON_CODE_SHIFT | offset


def native(*names):
    return [{"function": n, "module": "/usr/bin/python3", "file": None, "line": None}
            for n in names]


def names(frames):
    return [f["function"] for f in frames]


def test_each_call_of_the_evaluator_replaced_by_its_run():
    stack = native("malloc_caller", "_PyEval_EvalFrameDefault", "call_function",
                   "_PyEval_EvalFrameDefault.cold", "main")
    # innermost first: a run of two frames (inner, outer), then <module>'s own
    words = [word(1), word(2, entry=True), word(3, entry=True)]
    out = pf.interleave(stack, words, CODE, native_cut=False)
    assert names(out) == ["malloc_caller", "inner", "outer", "call_function", "<module>", "main"]
    assert all(f["kind"] == "python" for f in out if f["function"] in ("inner", "outer"))


def test_counts_that_disagree_are_said():
    stack = native("malloc_caller", "_PyEval_EvalFrameDefault", "main")
    words = [word(1, entry=True), word(2, entry=True)]
    out = pf.interleave(stack, words, CODE, native_cut=False)
    assert names(out)[:3] == ["malloc_caller", "_PyEval_EvalFrameDefault", "main"]
    assert out[3]["function"].startswith("[Python frames: 2 calls") and names(out)[4:] == [
        "inner", "outer"]
    # A native walk cut at its depth: the outer runs go after it, nothing is said.
    out = pf.interleave(stack[:2], words, CODE, native_cut=True)
    assert names(out) == ["malloc_caller", "inner", "outer"]


def test_unrecorded_and_unreadable_frames_are_named_as_such():
    assert pf.frame_dict(word(9), CODE)["function"] == pf.UNRECORDED
    assert pf.frame_dict(_native.PYTHON_UNREADABLE, CODE)["function"] == pf.UNREADABLE
