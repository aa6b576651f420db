"""The wheels (scripts/wheels.sh) on production hosts as they are (issue 42): a Debian 11 and a
Debian 13 root with python3, python3-venv and gdb and nothing else (no compiler, no -dev
package: checked), memhook installed from the wheel with pip into a venv there (its pure-Python
dependencies from the package index), then run inside the root on a target of that root: exact
bytes, named frames, and reports in text, JSON and HTML."""
from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Lines, Target, build, memhook_cmd
from test_libcs import ROOTS, Place

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = Path(os.environ.get("MEMHOOK_WHEELHOUSE", REPO / "wheelhouse"))
BARE = {"bullseye": "39", "trixie": "313"}  # each root's python3, cpXY


def wheel_for(tag: str) -> Path:
    found = sorted(WHEELHOUSE.glob(f"memhook_profiler-*-cp{tag}-cp{tag}-*manylinux_2_17_x86_64.whl"))
    if not found:
        message = f"no cp{tag} wheel in {WHEELHOUSE}: scripts/wheels.sh builds it"
        if os.environ.get("MEMHOOK_REQUIRE_WHEELS") == "1":  # scripts/test.sh built them
            pytest.fail(message)
        pytest.skip(message)
    return found[-1]


def in_root(root: Path, cmd: str, timeout=300) -> subprocess.CompletedProcess:
    # This machine reaches the package index through a proxy whose CA the bare root lacks: pip
    # in the root is given the host's bundle (a fact of this workplace, not of memhook).
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "PIP_CERT": "/w/ca.crt", "REQUESTS_CA_BUNDLE": "/w/ca.crt",
           "SSL_CERT_FILE": "/w/ca.crt", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INPUT": "1"}
    return subprocess.run(["chroot", str(root), "sh", "-c", cmd], capture_output=True,
                          text=True, timeout=timeout, env=env)


def traced_late_leak(memhook: list, capture: str, target: Target, env: dict | None = None,
                     timeout: float = 120) -> None:
    """`memhook` attached to lifecycle.c while it runs "go" (late_leak: 7 x 99 bytes), then
    Ctrl-C; the target finishes cleanly."""
    mh = subprocess.Popen([*memhook, "-p", str(target.pid), "--no-live", "-o", capture],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                          env=env)
    Lines(mh.stdout).expect("attached", timeout=timeout)
    target.command("go")
    mh.send_signal(signal.SIGINT)
    _, err = mh.communicate(timeout=timeout)
    assert mh.returncode == 0, err
    assert target.finish() == 0


def late_leak_sites(report: dict) -> list:
    return [s for s in report["sites"]
            if any(f.get("function") == "late_leak" for f in s["frames"])]


@pytest.mark.parametrize("suite", list(BARE))
def test_wheel_on_a_bare_host(tmp_path, suite):
    whl = wheel_for(BARE[suite])
    root = ROOTS / f"{suite}-bare"
    if not (root / ".memhook-root").exists():
        message = f"no {suite}-bare root in {ROOTS}: scripts/roots.sh builds it"
        if os.environ.get("MEMHOOK_REQUIRE_ROOTS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    # Nothing to build with: no compiler, no CMake, no -dev package.
    tools = in_root(root, "for t in gcc cc g++ c++ cmake make; do command -v $t; done; "
                    "dpkg-query -W -f='${Package} ${Status}\\n' '*-dev' 2>/dev/null "
                    "| grep ' installed$' || true")
    assert tools.stdout.strip() == "", tools.stdout
    # A target of that Debian release, built in its compiler root and run in the bare one.
    compiler_root = Place(suite, "chroot")
    exe = compiler_root.build("lifecycle.c")
    w = root / "w"
    shutil.rmtree(w, ignore_errors=True)
    w.mkdir(mode=0o755)
    # memhook reads the target's /proc/PID files, as in any container
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    try:
        shutil.copy(exe, w / "lifecycle")
        shutil.copy(whl, w / whl.name)
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", w / "ca.crt")
        r = in_root(root, f"cd /w && python3 -m venv v && v/bin/pip install -q /w/{whl.name} "
                    "&& v/bin/memhook --version")
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.startswith("memhook ")
        target = Target(w / "lifecycle", argv=["chroot", str(root), "/w/lifecycle",
                                                "/nonexistent.so"])
        try:
            traced_late_leak(["chroot", str(root), "/w/v/bin/memhook"], "/w/cap.mh", target)
        finally:
            target.kill()
        rep = in_root(root, "/w/v/bin/memhook report /w/cap.mh --format json")
        assert rep.returncode == 0, rep.stderr
        late = late_leak_sites(json.loads(rep.stdout))
        assert sum(s["outstanding_bytes"] for s in late) == 7 * 99
        names = [f.get("function") for f in late[0]["frames"]]
        assert names[names.index("late_leak") + 1] == "main", names
        text = in_root(root, "/w/v/bin/memhook report /w/cap.mh")
        assert text.returncode == 0 and "late_leak" in text.stdout, text.stderr
        html = in_root(root, "/w/v/bin/memhook report /w/cap.mh --format html -o /w/r.html")
        assert html.returncode == 0, html.stderr
        assert "late_leak" in (w / "r.html").read_text()
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")])
        shutil.rmtree(w, ignore_errors=True)
        compiler_root.cleanup()


@pytest.mark.parametrize("version", ["3.9", "3.10", "3.11", "3.12", "3.13"])
def test_wheel_with_each_python(tmp_path, version, targets):
    """Each wheel in a venv of that CPython on this host (pyenv's), attached to a program here:
    exact bytes, the leak's function named."""
    import glob
    whl = wheel_for(version.replace(".", ""))
    bases = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python3"))
    if not bases:
        pytest.skip(f"no CPython {version} in /root/.pyenv/versions")
    venv = tmp_path / "v"
    subprocess.run([bases[-1], "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(whl)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # the wheel's module, not the checkout's
    where = subprocess.run([str(venv / "bin/python"), "-c", "import memhook._native as n; "
                            "print(n.__file__)"], capture_output=True, text=True, cwd="/")
    assert where.stdout.startswith(str(venv)), where
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    traced_late_leak([str(venv / "bin/memhook")], str(tmp_path / "cap.mh"), target)
    rep = subprocess.run([str(venv / "bin/memhook"), "report", str(tmp_path / "cap.mh"),
                          "--format", "json"], capture_output=True, text=True, cwd="/")
    assert rep.returncode == 0, rep.stderr
    late = late_leak_sites(json.loads(rep.stdout))
    assert sum(s["outstanding_bytes"] for s in late) == 7 * 99


@pytest.mark.arm64
def test_aarch64_wheel_in_the_arm64_guest(tmp_path, targets):
    """The manylinux aarch64 wheel (scripts/wheels.sh --arch aarch64, cross-built on the x86-64
    host) in a venv of the arm64 guest's python3, its pure-Python dependencies Debian's (the
    guest has no network), attached to a program there: exact bytes, the leak's function
    named, the text report."""
    if platform.machine() != "aarch64":
        pytest.skip("the arm64 tier runs it in its guest (scripts/arm64.sh test)")
    tag = f"{sys.version_info.major}{sys.version_info.minor}"
    found = sorted(WHEELHOUSE.glob(f"memhook_profiler-*-cp{tag}-cp{tag}-"
                                   "*manylinux_2_17_aarch64.whl"))
    if not found:
        pytest.fail(f"no cp{tag} aarch64 wheel in {WHEELHOUSE} (scripts/arm64.sh test builds it)")
    venv = tmp_path / "v"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # (the tier's own build)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    r = subprocess.run([str(venv / "bin/pip"), "install", "-q", "--no-deps", "--no-index",
                        str(found[-1])], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    where = subprocess.run([str(venv / "bin/python"), "-c", "import memhook._native as n; "
                            "print(n.__file__)"], capture_output=True, text=True, cwd="/",
                           env=env)
    assert where.stdout.startswith(str(venv)), where  # the wheel's module
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    traced_late_leak([str(venv / "bin/memhook")], str(tmp_path / "cap.mh"), target, env, 300)
    rep = subprocess.run([str(venv / "bin/memhook"), "report", str(tmp_path / "cap.mh"),
                          "--format", "json"], capture_output=True, text=True, cwd="/", env=env)
    assert rep.returncode == 0, rep.stderr
    late = late_leak_sites(json.loads(rep.stdout))
    assert sum(s["outstanding_bytes"] for s in late) == 7 * 99
    names = [f.get("function") for f in late[0]["frames"]]
    assert names[names.index("late_leak") + 1] == "main", names
    text = subprocess.run([str(venv / "bin/memhook"), "report", str(tmp_path / "cap.mh")],
                          capture_output=True, text=True, cwd="/", env=env)
    assert text.returncode == 0 and "late_leak" in text.stdout, text.stderr


def test_switching_builds_loads_each_library_once(tmp_path, targets):
    """Sessions of the source build and of the wheel in turn on one target: each build's hook
    library is loaded once and reused. (Each copy takes the target's static TLS for good;
    attach reused only the first copy loaded, so every switch loaded another, until dlopen
    failed with "cannot allocate memory in static TLS block".)"""
    import glob
    bases = sorted(glob.glob("/root/.pyenv/versions/3.11.*/bin/python3"))
    if not bases:
        pytest.skip("no CPython 3.11 in /root/.pyenv/versions")
    venv = tmp_path / "v"
    subprocess.run([bases[-1], "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(wheel_for("311"))],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # Another build of the library, as another memhook version's: its build-id changed.
    from memhook.consumer.session import hook_library
    from memhook.elf.slots import file_build_id
    lib = next(venv.glob("lib/python3.11/site-packages/memhook/libmemhook_hook.so"))
    data, bid = lib.read_bytes(), bytes.fromhex(file_build_id(str(lib)))
    assert data.count(bid) == 1
    lib.write_bytes(data.replace(bid, bytes([bid[0] ^ 0xff]) + bid[1:]))
    assert file_build_id(str(lib)) != file_build_id(hook_library())
    target = targets(build(tmp_path, "burst.c"))
    builds = {"source": memhook_cmd(), "wheel": [str(venv / "bin/memhook")]}
    for name in ["wheel", "source"] * 4:  # (the wheel's first: the source build's copy is not)
        run = subprocess.run(builds[name] + ["-p", str(target.pid), "--duration", "0.3",
                                             "--no-live"], capture_output=True, text=True,
                             timeout=120, cwd="/")
        assert run.returncode == 0, (name, run.stderr[-2000:])
        target.command("burst 1 1000")
    with open(f"/proc/{target.pid}/maps") as f:
        copies = {tuple(line.split()[3:5]) for line in f if "libmemhook_hook.so" in line}
    assert len(copies) == 2, copies  # (device, inode) of each library file mapped
    assert target.finish() == 0
