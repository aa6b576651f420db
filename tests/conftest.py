"""Shared by both tiers: real targets compiled here (tests/targets/), the real memhook CLI, and
for tests/integration the real GDB attached to them as root."""
from __future__ import annotations

import json
import os
import platform
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

# Tests interrupt memhook as a terminal's Ctrl-C would. A suite started in the background by a
# non-interactive shell inherits SIGINT ignored, and every child would too (Python then keeps
# it ignored until memhook installs its own handler): give children the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TARGETS = Path(__file__).parent / "targets"
DEFAULT_FLAGS = ["-g", "-O0", "-fno-omit-frame-pointer"]
WORKERS, ITERS, LEAKS = 4, 20000, 100  # tests/targets/threads.c's workload
NO_ASLR = ["setarch", platform.machine(), "-R"]  # a target at the same addresses as under gdb


def build(tmp_path: Path, source: str, *, name: str | None = None, flags=(), libs=(),
          base_flags=DEFAULT_FLAGS, compiler: str | None = None) -> Path:
    src = TARGETS / source
    out = tmp_path / (name or src.stem)
    compiler = compiler or ("g++" if src.suffix == ".cpp" else "gcc")
    cmd = [compiler, *base_flags, *flags, "-I", str(TARGETS), str(src), "-o", str(out),
           "-lpthread", "-ldl", *libs]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


class Lines:
    """Lines of a child's output, read on a thread so that waiting can time out."""

    def __init__(self, stream):
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream):
        try:
            for line in stream:
                self._q.put(line)
        except ValueError:  # the stream closed under the read (a test's teardown): its end
            pass
        self._q.put(None)

    def expect(self, word: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line with {word!r} within {timeout} s") from None
            if line is None:
                raise AssertionError(f"output ended while waiting for {word!r}")
            if word in line:
                return line


class Target:
    """A command-driven test target (tests/targets/harness.h)."""

    def __init__(self, exe: Path, *args, cwd=None, user=None, argv=None, nice=0):
        # nice: a busy target that must not starve memhook (its threads still run whenever
        # memhook waits); nice(1) execs the target, whose pid is the same.
        argv = argv or [str(exe), *map(str, args)]
        if nice:
            argv = ["nice", "-n", str(nice), *argv]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1,
                                     cwd=cwd or exe.parent, user=user, group=user and "nogroup")
        self.lines = Lines(self.proc.stdout)
        self.expect("ready")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect(self, word: str, timeout: float = 60) -> str:
        return self.lines.expect(word, timeout)

    def command(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        self.expect("done")

    def ask(self, cmd: str, answer: str) -> str:
        """Send `cmd`; return its line starting with `answer`."""
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.expect(answer).strip()
        self.expect("done")
        return line

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


def flame_stacks(page: str, which: str = "flame-data") -> list:
    """The HTML page's flame graph as its script reads it: per stack, [frame names root first,
    kinds, short names, weights...] (the page holds each frame once and stacks as indices)."""
    import re
    data = json.loads(re.search(rf"<script id='{which}' type='application/json'>(.*?)</script>",
                                page, re.S).group(1))
    return [[[data["frames"][i][k] for i in ids] for k in range(3)] + weights
            for ids, *weights in data["stacks"]]


class Memhook:
    """`memhook -p PID -o CAPTURE --no-live` running until stop()."""

    def __init__(self, pid: int, tmp_path: Path, *args, nice: int = 0):
        self.capture = tmp_path / f"capture-{pid}-{time.monotonic_ns()}.mh"
        self.proc = subprocess.Popen(["nice", "-n", str(nice)] * bool(nice) +
                                     memhook_cmd("-p", pid, "--no-live", "-o", self.capture,
                                                 *args),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd="/")
        self.lines = Lines(self.proc.stdout)
        try:
            self.attached_line = self.lines.expect("attached", timeout=120)
        except AssertionError:
            self.proc.kill()
            raise AssertionError(f"memhook did not attach: {self.proc.stderr.read().strip()}") from None

    def stop(self) -> dict:
        """SIGINT, as an operator's Ctrl-C; returns the JSON report of the capture."""
        self.proc.send_signal(signal.SIGINT)
        return self.wait()

    def wait(self, timeout: float = 120) -> dict:
        self.proc.wait(timeout=timeout)
        err = self.proc.stderr.read()
        self.stderr = err
        assert self.proc.returncode == 0, f"memhook failed ({self.proc.returncode}): {err}"
        assert "Traceback" not in err
        rep = run_memhook("report", self.capture, "--format", "json")
        assert rep.returncode == 0, rep.stderr
        return json.loads(rep.stdout)


def traced(target: "Target", tmp_path: Path, *commands: str) -> tuple["Memhook", dict]:
    """memhook attached to `target` while it runs `commands`, then Ctrl-C; the target must then
    exit with status 0. Returns the Memhook (its stderr, its capture) and the JSON report."""
    mh = Memhook(target.pid, tmp_path)
    for command in commands:
        target.command(command)
    report = mh.stop()
    assert target.finish() == 0
    return mh, report


def short_sessions(pid: int, cycles: int, longest_s: float, seed: int, while_attached=None):
    """Sessions attached and detached one after another through the Session API (no CLI: a
    cycle takes a few tens of ms), each lasting up to `longest_s` more than `while_attached()`
    takes (what must happen in each session, however loaded the machine): yields (cycle, the
    session, detached)."""
    import random

    from memhook.consumer.session import Options, Session
    rng = random.Random(seed)
    for cycle in range(cycles):
        session = Session(pid, Options())
        session.attach()
        if while_attached:
            while_attached()
        time.sleep(rng.uniform(0, longest_s))
        session.detach("cycle")
        yield cycle, session


def progressed(target: "Target", rounds: int = 2, timeout: float = 60) -> None:
    """Until a harness_serve_rounds target (harness.h) has done `rounds` more rounds."""
    seen = int(target.ask("rounds", "rounds").split()[1])
    deadline = time.monotonic() + timeout
    while int(target.ask("rounds", "rounds").split()[1]) < seen + rounds:
        assert time.monotonic() < deadline, "the target made no progress"
        time.sleep(0.001)


def site(report: dict, function: str, frame: int = 0) -> dict:
    """The one site whose frame `frame` is in `function` (matched on the name's start)."""
    found = [s for s in report["sites"] if len(s["frames"]) > frame
             and (s["frames"][frame]["function"] or "").startswith(function)]
    assert len(found) == 1, f"{len(found)} sites for {function}: " + json.dumps(
        [[f["function"] for f in s["frames"][:3]] for s in report["sites"]])
    return found[0]


def report(capture, *args):
    proc = run_memhook("report", capture, *args)
    assert proc.returncode == 0, proc.stderr
    return proc

def report_json(capture, *args):
    return json.loads(report(capture, "--format", "json", *args).stdout)

def one_line_error(proc, code, *words):
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memhook: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]

def slot_values(pid, exe):
    from memhook.common.procfs import Memory
    from memhook.elf import slots as elf
    layout = elf.scan(pid, str(exe))
    with Memory(pid) as mem:
        return layout, {s.addr: mem.u64(s.addr) for s in layout.slots}

def assert_restored(pid, exe, before):
    """Every slot holds what it held before memhook — or, for a lazy slot that has been called
    since, the function the dynamic linker bound it to; none anywhere points into memhook's
    library (libraries loaded since, such as the hook library's own libgcc_s, included)."""
    from memhook.common.procfs import read_maps
    layout, after = slot_values(pid, exe)
    hook_of = {s.addr: s.hook_id for s in layout.slots}
    wrong = {a: (before[a], after.get(a)) for a in before
             if after.get(a) not in (before[a], layout.real.get(hook_of.get(a)))}
    assert not wrong
    hook = [(m.start, m.end) for m in read_maps(pid) if "libmemhook_hook" in m.path]
    assert not [a for a, v in after.items() if any(lo <= v < hi for lo, hi in hook)]


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


def world_readable_copy(exe: Path, where: str = "/tmp") -> Path:
    """A copy of `exe` that any user can run (pytest's own directories are root's, 0700)."""
    home = Path(tempfile.mkdtemp(prefix="mh-test-", dir=where))
    os.chmod(home, 0o755)
    shutil.copy(exe, home / exe.name)
    os.chmod(home / exe.name, 0o755)
    return home / exe.name


@pytest.fixture
def nobody_target(tmp_path):
    """lifecycle.c running as user nobody."""
    exe = world_readable_copy(build(tmp_path, "lifecycle.c"))
    t = Target(exe, "/nonexistent.so", user="nobody")
    yield t
    t.kill()
    shutil.rmtree(exe.parent)


@pytest.fixture(autouse=True)
def _root_only(request):
    """tests/integration attaches to real targets with ptrace, as root; tests/unit needs neither
    root nor GDB."""
    if os.geteuid() != 0 and "integration" in Path(str(request.node.path)).parts:
        pytest.skip("memhook attaches with ptrace: these tests run as root")
