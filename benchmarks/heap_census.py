"""The heap census (memhook/consumer/heap_census.py, hook_cpp/census/) on a big heap: walk speed per GiB,
memhook's memory for it, the target's longest stall while it reads, and the attach pause with
and without it, alternated in one session.

The target (targets/big_heap.cpp) holds 10 M blocks in over 1 GiB of the main arena's heap, with
a thread that records the longest gap between its 1 ms wake-ups.

    sudo .venv/bin/python benchmarks/heap_census.py [--blocks 10000000] [--rounds 5]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from driver import HERE, Session, Target, spread


def census_in_child(pid: int) -> dict:
    """One census in a fresh Python: its result's timing and the process's peak RSS growth."""
    code = ("import json, resource, sys; from memhook import heap_census;"
            "r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
            f"c, blocks = heap_census.take({pid}, 'glibc', sys.argv[1], keep_blocks=True);"
            "r1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
            "print(json.dumps({'walk': c['walk_seconds'], 'total': c['seconds'],"
            " 'heap': c['heap_bytes'], 'blocks': c['live']['blocks'], 'read': c['bytes_read'],"
            " 'uncertain': c['uncertain_bytes'], 'rss_kib': r1 - r0,"
            " 'types': c['by_type'][:1], 'kept_mib': blocks.memory_bytes() / 2**20}))")
    out = subprocess.run([sys.executable, "-c", code, glibc()], capture_output=True, text=True,
                         check=True, cwd="/").stdout
    return json.loads(out)


def glibc() -> str:
    out = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0].split()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    exe = tmp / "big_heap"
    subprocess.run(["g++", "-O2", "-o", str(exe), str(HERE / "targets" / "big_heap.cpp"),
                    "-lpthread"], check=True)
    started = time.monotonic()
    t = Target(str(exe), str(a.blocks))
    print(f"target: {a.blocks} blocks allocated in {time.monotonic() - started:.1f} s; "
          f"heap {t.ask('heap', 'heap') / 2**30:.2f} GiB (mallinfo2 arena)")
    walk, total, rss, idle_gap, census_gap = [], [], [], [], []
    for _ in range(a.rounds):
        t.ask("reset")
        time.sleep(1.0)
        idle_gap.append(t.ask("max", "max") / 1000)
        t.ask("reset")
        r = census_in_child(t.pid)
        census_gap.append(t.ask("max", "max") / 1000)
        walk.append(r["walk"])
        total.append(r["total"])
        rss.append(r["rss_kib"] / 1024)
    heap_gib = r["heap"] / 2**30
    print(f"census: {r['blocks']} live blocks, {heap_gib:.2f} GiB of heap walked, "
          f"{r['read'] / 2**20:.0f} MiB read, uncertain {r['uncertain']} B; "
          f"first type {r['types']}")
    print(f"walk (native)            : {spread(walk, ' s')}  = "
          f"{spread([heap_gib / w for w in walk], ' GiB/s')}")
    print(f"census (with /proc, ELF) : {spread(total, ' s')}")
    print(f"memhook's peak RSS growth: {spread(rss, ' MiB', 1)} (the blocks kept to match frees: "
          f"{r['kept_mib']:.1f} MiB)")
    print(f"target's longest stall   : idle {spread(idle_gap, ' ms')}, "
          f"during the census {spread(census_gap, ' ms')}")
    pauses = {"with": [], "without": []}
    attach_s = {"with": [], "without": []}
    seen = {"with": [], "without": []}
    for _ in range(a.rounds):
        for key, args in (("with", ()), ("without", ("--no-heap-census",))):
            t.ask("reset")
            began = time.monotonic()
            mh = Session(t.pid, *args)
            attach_s[key].append(time.monotonic() - began)
            pauses[key].append(mh.attach_ms)
            seen[key].append(t.ask("max", "max") / 1000)
            mh.stop()
    for key in ("with", "without"):
        print(f"attach {key:7} census: pause told {spread(pauses[key], ' ms')}, seen by the "
              f"target {spread(seen[key], ' ms')}, attach took {spread(attach_s[key], ' s')}")
    assert t.close() == 0


if __name__ == "__main__":
    main()
