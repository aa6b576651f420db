"""Symbolization speed (issue 3): a capture with tens of thousands of unique stacks whose frames
are return addresses spread over a large library, reported as text and as JSON.

    .venv/bin/python benchmarks/symbolize.py [--stacks 20000] [--depth 8] [--module PATH]

Addresses are real call sites: the instruction after each `call` in the module's text, found
with objdump, so symbols, lines and inlined frames are looked up as in a real capture.
"""
import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from memhook import capture
from memhook.elf import slots as elf


def call_sites(path: str, limit: int) -> list:
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                         text=True, check=True).stdout
    lines = dis.splitlines()
    out = []
    for i, line in enumerate(lines[:-1]):
        if re.search(r"\tcall\s", line):
            m = re.match(r"\s*([0-9a-f]+):", lines[i + 1])
            if m:
                out.append(int(m.group(1), 16))
    random.Random(1).shuffle(out)
    return out[:limit]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", type=int, default=20000)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--module", default="/usr/lib/x86_64-linux-gnu/libc.so.6")
    ap.add_argument("--symbolizer", action="append", default=[],
                    help="memhook report's --symbolizer, each in turn (default: auto)")
    a = ap.parse_args()
    path = str(Path(a.module).resolve())
    bias = 0x7f0000000000
    sites = call_sites(path, 200_000)
    rng = random.Random(2)
    frames = np.array([bias + rng.choice(sites) for _ in range(a.stacks * a.depth)], np.uint64)
    n = a.stacks + 1
    cols = {k: np.zeros(n, np.uint64) for k in capture.SITE_COLUMNS}
    cols["alloc_count"][1:] = 1
    cols["alloc_bytes"][1:] = cols["outstanding_bytes"][1:] = np.arange(1, n, dtype=np.uint64)
    cols["outstanding_count"][1:] = 1
    cols["op_mask"][1:] = 2
    size = Path(path).stat().st_size
    mod = {"path": path, "build_id": elf.file_build_id(path), "bias": bias, "lo": bias,
           "hi": bias + size + (1 << 24), "size": size, "mtime": 0}
    cap = capture.Capture({"pid": 1, "command": "synthetic", "duration_s": 1.0,
                           "totals": {}}, [mod], cols,
                          np.concatenate([[0], np.arange(0, len(frames) + 1, a.depth)]).astype(np.uint64), frames, {},
                          None, True)
    out = Path(tempfile.mkdtemp()) / "synthetic.mh"
    capture.write(str(out), cap)
    unique = len(set(frames.tolist()))
    print(f"{a.stacks} stacks x {a.depth} frames, {unique} unique addresses in {path}")
    for tool in a.symbolizer or ["auto"]:
        for fmt in ("text", "json"):
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "memhook", "report", str(out), "--format", fmt,
                            "-o", "/dev/null", "--symbolizer", tool], check=True, cwd="/")
            print(f"memhook report --format {fmt} --symbolizer {tool}: "
                  f"{time.monotonic() - t0:.2f} s")


if __name__ == "__main__":
    main()
