"""Captures made here, for the unit tier: a real program compiled with gcc (tests/unit/native/
unwind_*.c, so that symbols and lines are real), and stacks of real return addresses in it,
with the aggregates, time series and metadata a session would have written."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from memhook import capture
from memhook.elf.slots import file_build_id

NATIVE = Path(__file__).parent / "native"
BIAS = 0x555555554000


def compile_program(where: Path, link=(), name: str = "program") -> Path:
    """tests/unit/native/unwind_framed.c with frame pointers and unwind_frameless.c without,
    linked into one program (with `link`'s options)."""
    objs = []
    for src, fp in (("unwind_framed.c", "-fno-omit-frame-pointer"),
                    ("unwind_frameless.c", "-fomit-frame-pointer")):
        obj = where / (Path(src).stem + ".o")
        subprocess.run(["gcc", "-O2", "-g", fp, "-c", str(NATIVE / src), "-o", str(obj)],
                       check=True)
        objs.append(str(obj))
    exe = where / name
    subprocess.run(["gcc", *objs, *link, "-o", str(exe)], check=True)
    return exe


def instructions(exe: Path, function: str) -> list[tuple[int, str]]:
    """(address, text) of each of a function's instructions, by objdump."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={function}",
                          str(exe)], capture_output=True, text=True, check=True).stdout
    return [(int(m.group(1), 16), m.group(2).strip()) for m in
            re.finditer(r"^\s+([0-9a-f]+):\s+(.*)$", out, re.M)]


def return_addresses(exe: Path, function: str) -> list[int]:
    """Link-time addresses just after each call in `function`: return addresses into it."""
    code = instructions(exe, function)
    return [code[i + 1][0] for i, (_, text) in enumerate(code[:-1]) if text.startswith("call")]


def module(exe: Path, bias: int = BIAS) -> dict:
    from elftools.elf.elffile import ELFFile
    with open(exe, "rb") as f:
        loads = [s.header for s in ELFFile(f).iter_segments() if s.header.p_type == "PT_LOAD"]
    st = os.stat(exe)
    return {"path": str(exe), "build_id": file_build_id(str(exe)), "bias": bias,
            "lo": bias + loads[0].p_vaddr, "hi": bias + max(h.p_vaddr + h.p_memsz for h in loads),
            "size": st.st_size, "mtime": int(st.st_mtime)}


@dataclass
class Stack:
    frames: list          # link-time return addresses, the call site first (an
                          # address of 2^32 or more is taken as it is: code in no file)
    alloc_count: int
    alloc_bytes: int
    free_count: int = 0
    free_bytes: int = 0
    history: list = field(default_factory=list)  # outstanding bytes at each sample

    @property
    def outstanding_bytes(self) -> int:
        return self.alloc_bytes - self.free_bytes

    @property
    def outstanding_count(self) -> int:
        return self.alloc_count - self.free_count


def make(exe: Path, stacks: list[Stack], *, bias: int = BIAS, pid: int = 4242,
         interval: float = 5.0, started_at: float = 1.7e9) -> capture.Capture:
    """A capture of `stacks` (ids 1, 2, ... in order), the program mapped at `bias`."""
    n = len(stacks) + 1
    cols = capture.SITE_COLUMNS + capture.UNCERTAIN_COLUMNS
    sites = {k: np.zeros(n, np.uint64) for k in cols}
    offsets, frames = [0, 0], []
    for i, s in enumerate(stacks, 1):
        for k in ("alloc_count", "alloc_bytes", "free_count", "free_bytes",
                  "outstanding_count", "outstanding_bytes"):
            sites[k][i] = getattr(s, k)
        sites["op_mask"][i] = 1 << 1  # malloc
        frames += [f if f >= 1 << 32 else bias + f for f in s.frames]
        offsets.append(len(frames))
    samples = max((len(s.history) for s in stacks), default=0)
    series: dict = {}
    if samples:
        times = np.arange(1, samples + 1) * interval
        series = {k: np.zeros(samples, np.uint64) for k in capture.SERIES_COLUMNS[1:]
                  + capture.MEMORY_COLUMNS}
        series["time_s"] = times
        ids, at, vals = [], [], []
        for i, s in enumerate(stacks, 1):
            last = None
            for t, v in zip(times, s.history):
                series["outstanding_bytes"][int(t / interval) - 1] += np.uint64(v)
                if v != last:
                    ids.append(i)
                    at.append(t)
                    vals.append(v)
                    last = v
        series.update({"stk_id": np.array(ids, np.uint64), "stk_time_s": np.array(at),
                       "stk_bytes": np.array(vals, np.uint64),
                       "top_time_s": np.zeros(0), "top_stack": np.zeros(0, np.uint64),
                       "top_bytes": np.zeros(0, np.uint64)})
    duration = samples * interval
    totals = {k: int(sites[k].sum()) for k in ("alloc_count", "alloc_bytes", "free_count",
                                               "free_bytes", "outstanding_count",
                                               "outstanding_bytes")}
    totals.update(unknown_free_count=0, dropped_events=0, dropped_frees=0, unordered_events=0,
                  sample_rate=0, sampled_allocations=0, reconciled_frees=0, uncertain_count=0,
                  uncertain_bytes=0)
    meta = {"pid": pid, "command": f"{exe} --serve", "exe": str(exe), "host": "testhost",
            "started_at": started_at, "ended_at": started_at + duration,
            "duration_s": duration, "end_reason": "interrupted", "sample_rate": 0,
            "totals": totals}
    return capture.Capture(meta, [module(exe, bias)], sites, np.array(offsets, np.uint64),
                           np.array(frames, np.uint64), series=series, complete=True)
