"""Python line tables (symbolize/python_lines.py) against each CPython's own PyCode_Addr2Line,
at every instruction of real code, for every version's format (3.8 to 3.13 as pyenv built
them: co_lnotab, 3.10's co_linetable, the location table)."""
import json
import subprocess
from pathlib import Path

import pytest

from memhook.symbolize.python_lines import line_at

PYENV = Path("/root/.pyenv/versions")
DUMP = r"""
import ctypes, inspect, json, sys, types
import json.decoder
top = compile(inspect.getsource(inspect) + inspect.getsource(json.decoder), "x.py", "exec")
addr2line = ctypes.pythonapi.PyCode_Addr2Line
addr2line.argtypes, addr2line.restype = [ctypes.py_object, ctypes.c_int], ctypes.c_int
out = []
def walk(co):
    table = co.co_linetable if sys.version_info >= (3, 10) else co.co_lnotab
    out.append([co.co_firstlineno, table.hex(),
                [addr2line(co, o) for o in range(0, len(co.co_code), 2)]])
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            walk(c)
walk(top)
print(json.dumps([sys.version_info[1], out]))
"""


@pytest.mark.parametrize("minor", range(8, 14))
def test_lines_equal_the_interpreters_own(minor):
    python = next(iter(sorted(PYENV.glob(f"3.{minor}.*/bin/python3.{minor}"))), None)
    assert python is not None, f"no CPython 3.{minor} in {PYENV}"
    got_minor, codes = json.loads(subprocess.run([str(python), "-c", DUMP], capture_output=True,
                                                 text=True, check=True).stdout)
    assert got_minor == minor and len(codes) > 150
    checked = 0
    for first, table, lines in codes:
        table = bytes.fromhex(table)
        for i, want in enumerate(lines):
            assert line_at(minor, table, first, 2 * i) == (want if want >= 0 else None), (first, i)
            checked += 1
    assert checked > 10000
