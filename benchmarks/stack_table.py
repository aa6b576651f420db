"""The consumer's cost per new stack (issue 43: a Python program's import, 205,000 distinct
stacks of about 60 frames, dropped events at default settings while the consumer interned them).

A segment of one 1 MiB ring is written by hand (no target, no root), a ring's worth of allocation
records at a time, each from a stack never seen before (60 frames), and drained in this process;
prints the drains' time per new stack, the best of --repeats runs, and the first run's apart: a
fresh process's tables are pages the kernel must zero as they are first written, which on this
VM cost more than the interning itself.

    .venv/bin/python benchmarks/stack_table.py [--stacks 200000] [--frames 60] [--repeats 3]
"""
import argparse
import mmap
import os
import random
import struct
import tempfile
import time

from memhook import _native
from memhook.elf import hooks

RING_BYTES, DEPTH = 1 << 20, 64
ALLOC, TIME, THREAD = 1, 5, 6
MALLOC = hooks.BY_SYMBOL["malloc"].id
header = _native.record_header


def run(stacks: int, frames: int) -> float:
    """Seconds of drains for `stacks` new stacks of `frames` frames."""
    layout = _native.segment_layout(1, RING_BYTES, DEPTH)
    with tempfile.TemporaryDirectory() as tmp:
        fd = os.open(os.path.join(tmp, "segment"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _native.format_segment(fd, 1, RING_BYTES, DEPTH, _native.CLOCK_MONOTONIC, 0,
                                   2**64 - 1, 0, {}, [], 1000.0, 0, False)
            m = mmap.mmap(fd, layout["segment_bytes"])
            ring = layout["rings_offset"]
            data = ring + layout["ring_header_bytes"]
            consumer = _native.Consumer(fd)
            rng = random.Random(1)
            shared = [0x400000 + 16 * rng.randrange(1 << 20) for _ in range(frames)]
            start, n, busy = 0, 0, 0.0
            while n < stacks:
                words = [header(THREAD, aux=7), header(TIME), 1000] if not start else []
                while len(words) + 3 + frames <= RING_BYTES // 8 and n < stacks:
                    own = list(shared)  # (sharing most frames, as a program's stacks do)
                    own[0], own[1 + n % (frames - 1)] = 0x600000 + 16 * n, 0x500000 + 16 * n
                    words += [header(ALLOC, MALLOC, frames), 0x10000000 + 16 * n, 32, *own]
                    n += 1
                raw = struct.pack(f"<{len(words)}Q", *words)
                m[data:data + len(raw)] = raw
                struct.pack_into("<Q", m, ring + 8, start + len(raw))  # the write cursor
                struct.pack_into("<Q", m, ring + 64, start)  # the read cursor
                t0 = time.perf_counter()
                consumer.drain(final=False)
                consumer.drain(final=False)  # (the first leaves the line being written alone)
                busy += time.perf_counter() - t0
                start += RING_BYTES
            assert consumer.totals()["alloc_count"] == stacks
            m.close()
            return busy
        finally:
            os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", type=int, default=200_000)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    took = [run(a.stacks, a.frames) for _ in range(a.repeats)]
    best = min(took)
    print(f"{a.stacks} new stacks of {a.frames} frames: {best:.3f} s of drains, "
          f"{best / a.stacks * 1e9:.0f} ns a stack (runs {', '.join(f'{t:.3f}' for t in took)}); "
          f"the first run, on pages this process never had: {took[0] / a.stacks * 1e9:.0f} ns "
          "a stack (what a fresh memhook pays)")


if __name__ == "__main__":
    main()
