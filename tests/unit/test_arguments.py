"""Bad input before anything is attached: one line and a non-zero exit code, never a traceback
(tests/integration/test_cli.py has those that need a target)."""
import pytest

from conftest import one_line_error, run_memhook


@pytest.mark.parametrize("args,code,words", [
    (["-p", "999999999"], 1, ["no process"]),
    (["-p", "abc"], 2, ["invalid PID"]),
    (["-p", "-5"], 2, []),
    (["--duration", "3"], 2, ["-p"]),
    (["-p", "1", "--duration", "0"], 2, ["greater than 0"]),
    (["-p", "1", "--min-size", "lots"], 2, ["invalid size"]),
    (["-p", "1", "--depth", "0"], 2, ["depth"]),
    (["-p", "1", "--ring-size", "5000"], 2, ["power of two"]),
    (["report", "/nonexistent.mh"], 1, ["cannot open"]),
    (["report"], 2, []),
])
def test_bad_arguments(args, code, words):
    one_line_error(run_memhook(*args), code, *words)


@pytest.mark.parametrize("content", [b"", b"garbage" * 100, b"MEMHOOK\0CAPTURE\0" + b"\xff" * 8])
def test_bad_capture_files(tmp_path, content):
    bad = tmp_path / "bad.mh"
    bad.write_bytes(content)
    one_line_error(run_memhook("report", bad), 1)
