"""How long prepare's scan takes (elf.scan: every GOT slot of every loaded object, the real
functions) and elf.modules, on a process with many libraries, while it runs.

    sudo .venv/bin/python benchmarks/scan.py [--repeat 10]

Also times what elf/slots.py avoids: libstdc++'s dynamic symbols as pyelftools objects, against the
arrays memhook reads them as.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from elftools.elf.elffile import ELFFile

from memhook.elf import slots as elf

PROGRAM = "import ctypes, json, sqlite3, ssl, decimal, sys; sys.stdin.read()"


def best_and_median(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    a = ap.parse_args()
    target = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE)
    time.sleep(1.0)
    try:
        exe = os.readlink(f"/proc/{target.pid}/exe")
        layout = elf.scan(target.pid, exe)
        print(f"python3 with {len(layout.objects)} objects, {len(layout.slots)} slots")
        for name, fn in (("elf.scan", lambda: elf.scan(target.pid, exe)),
                         ("elf.modules", lambda: elf.modules(target.pid))):
            best, med = best_and_median(fn, a.repeat)
            print(f"{name:12} best {best * 1e3:7.1f} ms  median {med * 1e3:7.1f} ms")
    finally:
        target.kill()
    libstdcxx = next((p for p in ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6",) if
                      os.path.exists(p)), None)
    if libstdcxx:
        with open(libstdcxx, "rb") as f:
            e = ELFFile(f)
            dynsym = e.get_section_by_name(".dynsym")
            objects = best_and_median(lambda: [s.name for s in dynsym.iter_symbols()], 3)[0]
            arrays = best_and_median(lambda: np.frombuffer(dynsym.data(), dtype=elf.ELF64_SYM),
                                     3)[0]
        print(f"libstdc++ .dynsym: pyelftools objects {objects:.2f} s, arrays "
              f"{arrays * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
