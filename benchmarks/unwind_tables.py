"""Unwind-table build time and size (issue 18): libc, libstdc++ and libpython3.11 turned into
unwind rows cold (libdw, no cache) and from memhook's on-disk cache, best of REPEAT; and the
rows' bytes per MiB of each object's executable code.

    .venv/bin/python benchmarks/unwind_tables.py [--repeat 5] [objects...]
"""
import argparse
import os
import tempfile
import time

from elftools.elf.elffile import ELFFile

from memhook.elf.slots import build_id
from memhook.unwind import tables as unwind_tables

DEFAULT = ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
           "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"]


def text_bytes(path: str) -> int:
    with open(path, "rb") as f:
        return sum(s["sh_size"] for s in ELFFile(f).iter_sections()
                   if s["sh_flags"] & 0x4)  # SHF_EXECINSTR


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("objects", nargs="*", default=DEFAULT)
    a = ap.parse_args()
    objects = [p for p in a.objects if os.path.exists(p)]
    ids = {}
    for p in objects:
        with open(p, "rb") as f:
            ids[p] = build_id(ELFFile(f))
    with tempfile.TemporaryDirectory() as cache:
        cold, warm = [], []
        for _ in range(a.repeat):
            for name in os.listdir(cache):
                os.unlink(os.path.join(cache, name))
            t0 = time.perf_counter()
            rows = {p: unwind_tables.rows_for(p, ids[p], cache) for p in objects}
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            again = {p: unwind_tables.rows_for(p, ids[p], cache) for p in objects}
            warm.append(time.perf_counter() - t0)
            assert all(again[p].from_cache and again[p].rows == rows[p].rows for p in objects)
    print(f"{'object':<40} {'rows':>8} {'bytes':>9} {'text MiB':>9} {'bytes/MiB':>10}")
    for p in objects:
        n = len(rows[p].rows)
        mib = text_bytes(p) / 2**20
        print(f"{os.path.basename(p):<40} {n // 8:>8} {n:>9} {mib:>9.2f} {n / mib:>10.0f}")
    print(f"build, all {len(objects)}: cold {min(cold):.3f} s (worst {max(cold):.3f}), "
          f"from cache {min(warm) * 1000:.1f} ms (worst {max(warm) * 1000:.1f})")


if __name__ == "__main__":
    main()
