"""Targets memhook cannot or may not trace, and targets in their own mount namespace (other
libcs and roots: test_libcs.py)."""
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import (TARGETS, Memhook, Target, build, memhook_cmd, one_line_error, run_memhook,
                      site, world_readable_copy)


def wait_started(proc, exe_name):
    for _ in range(100):
        try:
            if os.path.basename(os.readlink(f"/proc/{proc.pid}/exe")) == exe_name:
                return
        except OSError:
            pass
        time.sleep(0.02)


def test_32_bit_target(tmp_path):
    obj, exe = tmp_path / "sleep32.o", tmp_path / "sleep32"
    subprocess.run(["as", "--32", str(TARGETS / "sleep32.s"), "-o", str(obj)], check=True)
    subprocess.run(["ld", "-m", "elf_i386", str(obj), "-o", str(exe)], check=True)
    proc = subprocess.Popen([str(exe)])
    try:
        wait_started(proc, "sleep32")
        if proc.poll() is not None:
            pytest.skip("this kernel runs no 32-bit programs")
        one_line_error(run_memhook("-p", proc.pid), 1, "built for x86-64 programs only", "32-bit")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_foreign_architecture_target(tmp_path):
    """An aarch64 program under qemu-user (the process is qemu's, static, x86-64): one line that
    names the emulation, not "statically linked". Built by zig (scripts/wheels.sh's toolchain)
    as a static aarch64 program, run by Debian's qemu-user-static (scripts/setup.sh)."""
    zig = Path("/var/cache/memhook-wheels/tools/bin/python")
    qemu = shutil.which("qemu-aarch64-static")
    if not (qemu and zig.exists()):
        if os.environ.get("MEMHOOK_REQUIRE_WHEELS") == "1":
            pytest.fail("qemu-user-static or zig missing (scripts/setup.sh --tests)")
        pytest.skip("qemu-user-static or zig missing (scripts/setup.sh --tests)")
    src, exe = tmp_path / "spin.c", tmp_path / "spin"
    src.write_text("#include <unistd.h>\nint main(void) { for (;;) sleep(1); }\n")
    subprocess.run([str(zig), "-m", "ziglang", "cc", "-target", "aarch64-linux-musl", "-static",
                    str(src), "-o", str(exe)], check=True, capture_output=True)
    proc = subprocess.Popen([qemu, str(exe)])
    try:
        wait_started(proc, "qemu-aarch64-static")
        one_line_error(run_memhook("-p", proc.pid), 1, "aarch64", "qemu-user", "built for x86-64 programs only")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_target_in_its_own_mount_namespace(tmp_path):
    """Private /tmp and /dev/shm, as in a container: memhook places its files through
    /proc/PID/root, where the target sees them."""
    exe = world_readable_copy(build(tmp_path, "lifecycle.c"), "/var/tmp")  # /tmp is hidden
    script = ("mount -t tmpfs none /tmp && mount -t tmpfs none /dev/shm && "
              f"exec {exe} /nonexistent.so")
    target = Target(exe, cwd=tmp_path, argv=["unshare", "--mount", "--propagation", "private",
                                             "sh", "-c", script])
    try:
        assert os.readlink(f"/proc/{target.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        mh = Memhook(target.pid, tmp_path)
        target.command("go")
        assert site(mh.stop(), "late_leak")["outstanding_bytes"] == 7 * 99
        assert target.finish() == 0
    finally:
        target.kill()


def test_without_cap_sys_ptrace(nobody_target):
    """Root without CAP_SYS_PTRACE may not trace another user's process: one clear line."""
    target = nobody_target
    proc = subprocess.run(["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps",
                           "-sys_ptrace", *memhook_cmd("-p", target.pid)],
                          capture_output=True, text=True, cwd="/")
    one_line_error(proc, 1, "not allowed", "CAP_SYS_PTRACE")
    target.command("go")
    assert target.finish() == 0


def test_not_root(tmp_path, targets):
    """An ordinary user may not trace root's process: one line that says to use sudo. (memhook
    runs from a world-readable copy of its installed packages, under the system Python, because
    the test environment's own interpreter may live in root's home.)"""
    import sys
    import sysconfig
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None or subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                                        capture_output=True, text=True).stdout.strip() != \
            str(sys.version_info[:2]):
        pytest.skip("no system python3 of this version to run memhook as another user")
    site_dir = Path(sysconfig.get_paths()["purelib"])
    lib = Path(tempfile.mkdtemp(prefix="mh-test-"))
    for name in os.listdir(site_dir):
        if name.startswith(("memhook", "numpy", "elftools", "pyelftools", "iced_x86")):
            src = site_dir / name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, lib / name)
    subprocess.run(["chmod", "-R", "a+rX", str(lib)], check=True)
    os.chmod(lib, 0o755)
    try:
        target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
        proc = subprocess.run([python, "-m", "memhook", "-p", str(target.pid)],
                              capture_output=True, text=True, cwd="/", user="nobody",
                              group="nogroup", env={"PYTHONPATH": str(lib), "PATH": "/usr/bin"})
        one_line_error(proc, 1, "not allowed", "sudo")
        target.command("go")
        assert target.finish() == 0
    finally:
        shutil.rmtree(lib)


def test_ptrace_refused_by_seccomp(tmp_path, targets):
    """A seccomp filter on memhook's own process (as a container's default profile) that
    refuses ptrace: one line that names seccomp, and the target untouched. (Yama's
    ptrace_scope is never raised here: at 3 only a reboot lowers it.)"""
    import ctypes
    import struct

    def refuse_ptrace():
        # BPF: arch x86-64 and nr == ptrace (101) -> EPERM; anything else allowed
        ins = [(0x20, 0, 0, 4), (0x15, 0, 3, 0xC000003E), (0x20, 0, 0, 0), (0x15, 0, 1, 101),
               (0x06, 0, 0, 0x00050000 | 1), (0x06, 0, 0, 0x7FFF0000)]
        code = b"".join(struct.pack("HBBI", *i) for i in ins)

        class Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
        prog = Prog(len(ins), code)
        if ctypes.CDLL(None).prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
            raise OSError("seccomp")
    target = targets(build(tmp_path, "lifecycle.c"), "/nonexistent.so")
    before = open(f"/proc/{target.pid}/maps").read()
    proc = subprocess.run(memhook_cmd("-p", target.pid), capture_output=True, text=True, cwd="/",
                          preexec_fn=refuse_ptrace)
    one_line_error(proc, 1, "not permitted", "seccomp")
    assert open(f"/proc/{target.pid}/maps").read() == before
    target.command("go")
    assert target.finish() == 0
