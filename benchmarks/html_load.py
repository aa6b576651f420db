"""The HTML page with many stacks in headless Chromium (issue 35: 10,000 stacks in under 2 s;
issue 43: the report of 10,000 stacks over 100 modules in at most 1 s).

A capture of STACKS distinct stacks, each DEPTH return addresses into this host's libc, or with
--modules N into libc and N-1 other shared libraries of this host (real functions, so that the
page holds real names and the flame graph real sharing), outstanding
bytes spread over four orders of magnitude, is written, reported as HTML (timed too), and
loaded in headless Chromium RUNS times; the page's script records when it has drawn
everything (performance.now() since navigation, on <body data-drawn-ms>).

    .venv/bin/python benchmarks/html_load.py [--stacks 10000] [--depth 12] [--runs 5]
                                             [--modules 1]
"""
import argparse
import glob
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from elftools.elf.elffile import ELFFile

from memhook import capture
from memhook.elf.slots import file_build_id

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
BIAS = 0x7f0000000000


def functions(path: str) -> list[tuple[int, int]]:
    with open(path, "rb") as f:
        syms = ELFFile(f).get_section_by_name(".dynsym")
        return sorted({(s["st_value"], s["st_size"]) for s in syms.iter_symbols()
                       if s["st_info"]["type"] == "STT_FUNC" and s["st_size"] > 16})


def loaded(path: str, bias: int) -> dict:
    """The module table's row of `path` loaded at `bias`."""
    st = os.stat(path)
    with open(path, "rb") as f:
        loads = [s.header for s in ELFFile(f).iter_segments() if s.header.p_type == "PT_LOAD"]
    return {"path": path, "build_id": file_build_id(path), "bias": bias,
            "lo": bias + loads[0].p_vaddr, "hi": bias + max(h.p_vaddr + h.p_memsz for h in loads),
            "size": st.st_size, "mtime": int(st.st_mtime)}


def libraries(n: int) -> list[tuple[str, list]]:
    """libc and n-1 other shared libraries of this host (each a file with a build-id and at
    least 4 functions), in name order, with their functions."""
    out = [(LIBC, functions(LIBC))]
    for path in sorted(glob.glob("/usr/lib/x86_64-linux-gnu/lib*.so.*")):
        if len(out) >= n:
            break
        if os.path.islink(path) or os.path.realpath(path) == os.path.realpath(LIBC):
            continue
        try:
            fns = functions(path) if file_build_id(path) else []
        except Exception:  # noqa: BLE001 (not an ELF file this benchmark can use)
            continue
        if len(fns) >= 4:
            out.append((path, fns))
    return out


def make_capture(stacks: int, depth: int, path: Path, nmodules: int = 1) -> None:
    rng = random.Random(1)
    libs = libraries(nmodules)
    # A few hundred distinct frames in all, spread over the modules: sharing, as in real
    # programs. Each module at its own address, 1 GiB apart.
    each = max(4, 400 // len(libs))
    callers = [(BIAS + (k << 30) + addr, size) for k, (_, fns) in enumerate(libs)
               for addr, size in fns[:each]]
    offsets, frames = [0], []
    for _ in range(stacks + 1):  # (stack 0 is the "no stack" row)
        for _ in range(depth):
            addr, size = rng.choice(callers)
            frames.append(addr + rng.randrange(8, size))
        offsets.append(len(frames))
    n = stacks + 1
    out = np.array([int(10 ** rng.uniform(2, 6)) for _ in range(n)], np.uint64)
    out[0] = 0
    count = np.maximum(out // 100, 1).astype(np.uint64)
    sites = {"alloc_count": count, "alloc_bytes": out, "free_count": np.zeros(n, np.uint64),
             "free_bytes": np.zeros(n, np.uint64), "outstanding_count": count,
             "outstanding_bytes": out, "op_mask": np.full(n, 2, np.uint64),
             "uncertain_count": np.zeros(n, np.uint64), "uncertain_bytes": np.zeros(n, np.uint64)}
    modules = [loaded(p, BIAS + (k << 30)) for k, (p, _) in enumerate(libs)]
    meta = {"pid": 1, "command": "synthetic", "exe": "/usr/bin/synthetic", "libc": "glibc",
            "duration_s": 60.0, "totals": {"alloc_count": int(count.sum()),
                                           "alloc_bytes": int(out.sum()),
                                           "outstanding_count": int(count.sum()),
                                           "outstanding_bytes": int(out.sum())}}
    capture.write(str(path), capture.Capture(meta, modules, sites,
                                             np.array(offsets, np.uint64),
                                             np.array(frames, np.uint64)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", type=int, default=10_000)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--modules", type=int, default=1, help="libc and N-1 other libraries")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    cap, page = tmp / "many.mh", tmp / "many.html"
    make_capture(a.stacks, a.depth, cap, a.modules)
    took = []
    # A cache of its own: the first report reads every module and writes its symbols and rows
    # (cold), the others read them back (warm: the figure is their median).
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp / "cache"))
    for _ in range(4):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "memhook", "report", str(cap), "--format", "html",
                        "-o", str(page)], check=True, cwd="/", env=env)
        took.append(time.monotonic() - t0)
    cold = took.pop(0)
    print(f"report --format html: {statistics.median(took):.2f} s (runs {', '.join(f'{t:.2f}' for t in took)}; "
          f"the first, symbols not cached yet, {cold:.2f} s), "
          f"page {page.stat().st_size / 1e6:.1f} MB, {a.stacks} stacks x {a.depth} frames "
          f"over {a.modules} module{'s' * (a.modules > 1)}; "
          f"capture {cap}")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    drawn, wall = [], []
    for run in range(a.runs):
        t0 = time.monotonic()
        dom = subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                              f"--user-data-dir={tmp / f'profile{run}'}", "--window-size=1200,3000",
                              "--dump-dom", page.as_uri()], capture_output=True, text=True,
                             timeout=300).stdout
        wall.append(time.monotonic() - t0)
        drawn.append(int(re.search(r'data-drawn-ms="(\d+)"', dom).group(1)) / 1000)
    print(f"drawn (navigation to the script's end): median {statistics.median(drawn):.2f} s "
          f"(runs {min(drawn):.2f}-{max(drawn):.2f} s)")
    print(f"chromium --dump-dom wall time, browser start included: median "
          f"{statistics.median(wall):.2f} s ({min(wall):.2f}-{max(wall):.2f} s)")


if __name__ == "__main__":
    main()
