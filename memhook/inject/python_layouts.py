"""Where each CPython version keeps a thread's frames and a code object's names: the offsets the
hooks read them by (PythonLayout, common/segment.h; hook_library/python_frames.h).

Release builds, one layout per minor version: CPython keeps these structures the same across a
minor version's releases (3.13 states it in _Py_DebugOffsets, which python_interpreter.py checks
this table against), and on x86-64 and AArch64 alike (both LP64; 3.11's checked against Debian
12's arm64 headers). Measured with offsetof() against each version's own headers
(Py_BUILD_CORE), as docs/python.md shows how."""
from __future__ import annotations

from .. import _native

# How a frame says which instruction it is at (InstrKind), and which frames begin a call of
# _PyEval_EvalFrameDefault (RunKind).
LASTI_BYTES, LASTI_UNITS, POINTER = 0, 1, 2
EACH_FRAME, ENTRY_FLAG, AFTER_SHIM = 0, 1, 2
NONE = -1   # the version has no such field
NO_OWNER = -2  # no frame owner of that kind (never equal to an owner byte, nor to NONE)

# Strings and bytes: PyASCIIObject lost its wstr pointer in 3.12.
_STR_3_8 = dict(str_length=16, str_state=32, str_ascii_data=48, str_compact_data=72)
_STR_3_12 = dict(str_length=16, str_state=32, str_ascii_data=40, str_compact_data=56)
_BYTES = dict(bytes_size=16, bytes_data=32)

# 3.8 to 3.10: PyFrameObject, one per call of _PyEval_EvalFrameDefault, f_back and f_lasti;
# co_lnotab (3.8, 3.9) or co_linetable (3.10), no qualified name in the code object.
_FRAME_OBJECT = dict(tstate_frame=24, cframe_current=NONE, frame_previous=24, frame_code=32,
                     frame_owner=NONE, frame_is_entry=NONE, run_kind=EACH_FRAME,
                     owner_generator=NO_OWNER, owner_cstack=NO_OWNER,
                     code_name=112, code_filename=104, code_firstlineno=40, code_linetable=120,
                     code_firsttraceable=NONE, code_units=NONE, code_consts=56,
                     code_basicsize=176, **_STR_3_8)

LAYOUTS = {
    8: dict(_FRAME_OBJECT, frame_instr=104, instr_kind=LASTI_BYTES),
    9: dict(_FRAME_OBJECT, frame_instr=104, instr_kind=LASTI_BYTES),
    10: dict(_FRAME_OBJECT, frame_instr=96, instr_kind=LASTI_UNITS),
    # 3.11: _PyInterpreterFrame in the thread's data stack, reached through tstate->cframe;
    # is_entry marks the first frame of each call; prev_instr.
    11: dict(tstate_frame=56, cframe_current=8, frame_previous=48, frame_code=32, frame_instr=56,
             instr_kind=POINTER, frame_owner=69, frame_is_entry=68, run_kind=ENTRY_FLAG,
             owner_generator=1, owner_cstack=NO_OWNER, code_name=128, code_filename=112,
             code_firstlineno=72, code_linetable=136, code_firsttraceable=168, code_units=184,
             code_consts=24, code_basicsize=184, **_STR_3_8),
    # 3.12: each call pushes a shim frame owned by the C stack before its first.
    12: dict(tstate_frame=56, cframe_current=0, frame_previous=8, frame_code=0, frame_instr=56,
             instr_kind=POINTER, frame_owner=70, frame_is_entry=NONE, run_kind=AFTER_SHIM,
             owner_generator=1, owner_cstack=3, code_name=128, code_filename=112,
             code_firstlineno=68, code_linetable=136, code_firsttraceable=176, code_units=192,
             code_consts=24, code_basicsize=192, **_STR_3_12),
    # 3.13: tstate->current_frame, f_executable, instr_ptr.
    13: dict(tstate_frame=72, cframe_current=NONE, frame_previous=8, frame_code=0,
             frame_instr=56, instr_kind=POINTER, frame_owner=70, frame_is_entry=NONE,
             run_kind=AFTER_SHIM, owner_generator=1, owner_cstack=3, code_name=128,
             code_filename=112, code_firstlineno=68, code_linetable=136,
             code_firsttraceable=184, code_units=200, code_consts=24, code_basicsize=200,
             **_STR_3_12),
}
for _layout in LAYOUTS.values():
    _layout.update(_BYTES)

# 3.13's _Py_DebugOffsets (the start of _PyRuntime), as 8-byte words: the fields this table
# has, by word index.
DEBUG_OFFSETS_COOKIE = b"xdebugpy"
DEBUG_OFFSET_WORDS = {"tstate_frame": 23, "frame_previous": 29, "frame_code": 30,
                      "frame_instr": 31, "frame_owner": 33, "code_filename": 35,
                      "code_name": 37, "code_linetable": 38, "code_firstlineno": 39,
                      "code_units": 43}
DEBUG_OFFSETS_FREE_THREADED = 2  # word index


def hook_layout(minor: int, symbols: dict) -> dict:
    """The PythonLayout the hooks get: the version's offsets and the target's addresses."""
    layout = {k: v for k, v in LAYOUTS[minor].items() if k != "code_basicsize"}
    return dict(layout, minor=minor, depth=_native.PYTHON_DEPTH, **symbols)
