"""The malloc hook's own cost, without GDB, memhook or a consumer (benchmarks/targets/hook_cost.cpp):
16-byte mallocs through memhook_hook_malloc against malloc itself, alternating batches of 1000 in
one process; prints ns per call and the ratio per run, then the median and spread over runs.
Compare two builds of the hook library (A/B, alternating runs) with --library A --library B.

    .venv/bin/python benchmarks/hook_cost.py [--runs 5] [--batches 2000] [--sse]
                                              [--library build/A/libmemhook_hook.so ...]

Needs no root: the library is loaded into the harness's own process.
"""
import argparse
import os
import platform
import statistics
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from memhook import _native
from memhook.elf import slots as elf

HERE = Path(__file__).parent
COMMON = HERE.parent / "hook_cpp" / "common"
ARCH = HERE.parent / "hook_cpp" / "arch" / platform.machine()  # (record_format.h's)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--sse", action="store_true", help="the SSE4.1 comparison even with AVX-512")
    ap.add_argument("--library", action="append", default=[],
                    help="a hook library build (repeat to compare builds; default: installed)")
    a = ap.parse_args()
    libraries = a.library or [str(resources.files("memhook").joinpath(elf.HOOK_LIBRARY_NAME))]
    tmp = Path(tempfile.mkdtemp())
    exe = tmp / "hook_cost"
    subprocess.run(["g++", "-O2", "-fno-omit-frame-pointer", "-I", str(COMMON), "-I", str(ARCH), "-o", str(exe),
                    str(HERE / "targets" / "hook_cost.cpp"), "-ldl"], check=True)
    ratios = {lib: [] for lib in libraries}
    for run in range(a.runs):
        for lib in libraries:  # alternating: the machine drifts between seconds
            segment = tmp / f"segment-{run}"
            fd = os.open(segment, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            _native.format_segment(fd, 1, 4 << 20, 32, _native.CLOCK_TSC, 0, 2**64 - 1, 0, {}, [],
                                   1000.0, 0, a.sse)
            os.close(fd)
            out = subprocess.run([str(exe), lib, str(segment), str(a.batches)], check=True,
                                 capture_output=True, text=True).stdout
            segment.unlink()
            v = {k: float(x) for k, x in (line.split() for line in out.splitlines())}
            ratios[lib].append(v["hooked"] / v["bare"])
            print(f"run {run + 1} {lib}: bare {v['bare']:.2f} ns, hooked {v['hooked']:.2f} ns, "
                  f"{v['hooked'] / v['bare']:.2f}x, dropped {int(v['dropped'])}")
    for lib, r in ratios.items():
        print(f"{lib}: median {statistics.median(r):.2f}x (runs {min(r):.2f}-{max(r):.2f}x)")


if __name__ == "__main__":
    main()
