"""Running the in-process harnesses (tests/targets/*_harness.cpp): each loads the real hook
library into its own process, no GDB, on a segment formatted here as memhook would. On this
host's processor, the installed library; for AArch64 (issue 46), a cross-built one run under
qemu-user, with or without pointer authentication as the CPU model has it. Either processor's
musl build too: the harness linked against musl (Debian's musl-dev, musl-dev:arm64), the library
reaching its TLS through descriptors."""
from __future__ import annotations

import fcntl
import os
import platform
import subprocess
from pathlib import Path

from conftest import build
from memhook import _native
from memhook.consumer import session

REPO = Path(__file__).parents[2]
COMMON = REPO / "hook_cpp" / "common"
CROSS_BUILD = REPO / "build" / "test-hooks-aarch64"
AARCH64_LIBC = "/usr/aarch64-linux-gnu"  # Debian's cross glibc (g++-aarch64-linux-gnu)


def musl_specs(arch: str) -> Path:
    specs = Path(f"/usr/lib/{arch}-linux-musl/musl-gcc.specs")
    assert specs.exists(), f"no {specs}: scripts/setup.sh --tests installs musl for {arch}"
    return specs


def aarch64_hook_library(musl: bool = False) -> Path:
    """The hook library cross-built for AArch64 from this checkout (scripts/aarch64-toolchain.cmake),
    incrementally, one build at a time across test workers; or its musl build."""
    CROSS_BUILD.mkdir(parents=True, exist_ok=True)
    with open(CROSS_BUILD.parent / "test-hooks-aarch64.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = {k: v for k, v in os.environ.items() if k != "MEMHOOK_SYSROOT"}
        if not (CROSS_BUILD / "CMakeCache.txt").exists():
            subprocess.run(["cmake", "-S", str(REPO), "-B", str(CROSS_BUILD),
                            f"-DCMAKE_TOOLCHAIN_FILE={REPO / 'scripts/aarch64-toolchain.cmake'}",
                            "-DMEMHOOK_CONSUMER=OFF", "-DCMAKE_BUILD_TYPE=Release"],
                           check=True, capture_output=True, env=env)
        target = "memhook_hook_musl" if musl else "memhook_hook"
        out = subprocess.run(["cmake", "--build", str(CROSS_BUILD), "--target", target],
                             capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return CROSS_BUILD / ("musl" if musl else "") / "libmemhook_hook.so"


def run(tmp_path: Path, source: str, *args, ring_bytes: int = 1 << 16, depth: int = 8,
        sample_rate: int = 0, sse: bool = False, aarch64_cpu: str | None = None,
        musl: bool = False) -> tuple[str, Path]:
    """The harness's output (it must exit 0) and its segment file. `aarch64_cpu`: the harness
    and the hook library built for AArch64 (the harness with -mbranch-protection=standard, so
    that its return addresses are signed where the CPU model has pointer authentication), run
    under qemu-user with that CPU model. `musl`: the harness and the library built for musl (the
    harness by the C driver: nothing of libstdc++'s)."""
    arch = "aarch64" if aarch64_cpu else platform.machine()
    flags = ["-O1", "-I", str(COMMON), "-I", str(REPO / "hook_cpp" / "arch" / arch)]
    name = Path(source).stem + ("-aarch64" if aarch64_cpu else "") + ("-musl" if musl else "")
    cross = "aarch64-linux-gnu-" if aarch64_cpu else ""
    if musl:
        flags += [f"-specs={musl_specs(arch)}", "-fno-exceptions", "-fno-rtti"]
    if aarch64_cpu:
        flags.append("-mbranch-protection=standard")
    exe = build(tmp_path, source, name=name, flags=flags,
                compiler=cross + ("gcc" if musl else "g++"))
    if aarch64_cpu is None:
        library = session.hook_library("musl" if musl else "glibc")
        runner = []
    else:
        library = aarch64_hook_library(musl)
        # (musl's loader is found where the harness names it: musl-dev:arm64's)
        runner = ["qemu-aarch64-static", "-cpu", aarch64_cpu, *([] if musl else ["-L", AARCH64_LIBC])]
    segment = tmp_path / f"segment-{len(list(tmp_path.glob('segment-*')))}"
    fd = os.open(segment, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _native.format_segment(fd, 1, ring_bytes, depth, _native.CLOCK_MONOTONIC, 0, 2**64 - 1,
                               0, {}, [], 1000.0, sample_rate, sse)
    finally:
        os.close(fd)
    out = subprocess.run([*runner, exe, str(library), str(segment), *map(str, args)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout, segment


def ring(segment: Path, ring_bytes: int, depth: int) -> tuple[bytes, int]:
    """Ring 0's bytes and its write cursor."""
    import struct
    layout = _native.segment_layout(1, ring_bytes, depth)
    data = segment.read_bytes()
    at = layout["rings_offset"]
    write, = struct.unpack_from("<Q", data, at + 8)  # RingHeader.write
    return data[at + layout["ring_header_bytes"]:][:ring_bytes], write
