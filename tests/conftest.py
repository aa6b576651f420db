"""Real targets, compiled here; the real memhook CLI attached to them with the real GDB."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TARGETS = Path(__file__).parent / "targets"
DEFAULT_FLAGS = ["-g", "-O0", "-fno-omit-frame-pointer"]


def build(tmp_path: Path, source: str, *, name: str | None = None, flags=(), libs=(),
          base_flags=DEFAULT_FLAGS) -> Path:
    src = TARGETS / source
    out = tmp_path / (name or src.stem)
    compiler = "g++" if src.suffix == ".cpp" else "gcc"
    cmd = [compiler, *base_flags, *flags, "-I", str(TARGETS), str(src), "-o", str(out),
           "-lpthread", "-ldl", *libs]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


class Target:
    """A command-driven test target (tests/targets/harness.h)."""

    def __init__(self, exe: Path, *args, cwd=None):
        self.proc = subprocess.Popen([str(exe), *map(str, args)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1,
                                     cwd=cwd or exe.parent)
        self.expect("ready")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect(self, word: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    raise AssertionError(f"target exited ({self.proc.wait()}) waiting for {word}")
                if line.startswith(word):
                    return line
        raise AssertionError(f"target did not say {word!r} within {timeout} s")

    def command(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        self.expect("done")

    def finish(self) -> int:
        self.proc.stdin.write("exit\n")
        self.proc.stdin.flush()
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def memhook_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "memhook", *map(str, args)]


def run_memhook(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(memhook_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          cwd="/")


class Memhook:
    """`memhook -p PID -o CAPTURE --no-live` running until stop()."""

    def __init__(self, pid: int, tmp_path: Path, *args):
        self.capture = tmp_path / f"capture-{pid}-{time.monotonic_ns()}.mh"
        self.proc = subprocess.Popen(memhook_cmd("-p", pid, "--no-live", "-o", self.capture,
                                                 *args),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd="/")
        self.attached_line = self._wait_attached()

    def _wait_attached(self, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if "attached" in line:
                    return line
                if not line:
                    break
        self.proc.kill()
        _, err = self.proc.communicate()
        raise AssertionError(f"memhook did not attach: {err.strip()}")

    def stop(self) -> dict:
        """SIGINT, as an operator's Ctrl-C; returns the JSON report of the capture."""
        self.proc.send_signal(signal.SIGINT)
        return self.wait()

    def wait(self, timeout: float = 120) -> dict:
        out, err = self.proc.communicate(timeout=timeout)
        self.stdout, self.stderr = out, err
        assert self.proc.returncode == 0, f"memhook failed ({self.proc.returncode}): {err}"
        assert "Traceback" not in err
        rep = run_memhook("report", self.capture, "--format", "json")
        assert rep.returncode == 0, rep.stderr
        return json.loads(rep.stdout)


def site(report: dict, function: str, frame: int = 0) -> dict:
    """The one site whose frame `frame` is in `function` (matched on the name's start)."""
    found = [s for s in report["sites"] if len(s["frames"]) > frame
             and (s["frames"][frame]["function"] or "").startswith(function)]
    assert len(found) == 1, f"{len(found)} sites for {function}: " + json.dumps(
        [[f["function"] for f in s["frames"][:3]] for s in report["sites"]])
    return found[0]


@pytest.fixture
def targets():
    """Start targets; every one still running at the end is killed."""
    started = []

    def start(exe, *args, **kw):
        t = Target(exe, *args, **kw)
        started.append(t)
        return t

    yield start
    for t in started:
        t.kill()


@pytest.fixture(autouse=True)
def _root_only():
    if os.geteuid() != 0:
        pytest.skip("memhook attaches with ptrace: the tests run as root")
