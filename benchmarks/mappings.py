"""The cost of the mapping hooks (mmap, munmap): a loop that maps 64 KiB anonymously, touches a
byte and unmaps it, unprofiled and with memhook attached, alternated in one process.

    sudo .venv/bin/python benchmarks/mappings.py [--cycles 7] [--calls 20000]
"""
import argparse
import tempfile
from pathlib import Path

from driver import alternate, build, spread


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--size", type=int, default=65536)
    a = ap.parse_args()
    from driver import Target
    t = Target(build("mmap_loop", Path(tempfile.mkdtemp())))
    bare, hooked, _, _ = alternate(t.pid, a.cycles, (), ["pair"],
                                   lambda k: t.ask(f"run {a.calls} {a.size}", "ns"))
    ratios = [h / b for b, h in zip(bare["pair"], hooked["pair"])]
    print(f"mmap + touch + munmap of {a.size} B, {a.calls} pairs, {a.cycles} cycles:")
    print(f"  unprofiled {spread(bare['pair'], ' ns', 0)}, traced {spread(hooked['pair'], ' ns', 0)}")
    print(f"  traced / unprofiled per cycle: {spread(ratios, 'x')}")
    assert t.close() == 0


if __name__ == "__main__":
    main()
