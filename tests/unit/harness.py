"""Running the in-process harnesses (tests/targets/*_harness.cpp): each loads the real hook
library into its own process, no GDB, on a segment formatted here as memhook would."""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import resources
from pathlib import Path

from conftest import build
from memhook import _native, elf

COMMON = Path(__file__).parents[2] / "hook_cpp" / "common"
ARCH = Path(__file__).parents[2] / "hook_cpp" / "arch" / platform.machine()  # (record_format.h's)


def run(tmp_path: Path, source: str, *args, ring_bytes: int = 1 << 16, depth: int = 8,
        sample_rate: int = 0, sse: bool = False) -> tuple[str, Path]:
    """The harness's output (it must exit 0) and its segment file."""
    exe = build(tmp_path, source, flags=["-O1", "-I", str(COMMON), "-I", str(ARCH)])
    segment = tmp_path / f"segment-{len(list(tmp_path.glob('segment-*')))}"
    fd = os.open(segment, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _native.format_segment(fd, 1, ring_bytes, depth, _native.CLOCK_MONOTONIC, 0, 2**64 - 1,
                               0, {}, [], 1000.0, sample_rate, sse)
    finally:
        os.close(fd)
    library = resources.files("memhook").joinpath(elf.HOOK_LIBRARY_NAME)
    out = subprocess.run([exe, str(library), str(segment), *map(str, args)],
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
