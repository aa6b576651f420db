"""The resident-memory parts (memhook/common/resident.py): every mapping in one part, so the parts sum
to smaps' own totals; thread stacks named, arena heaps and the program's mmap told apart."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from memhook.common import resident

NATIVE = Path(__file__).parent / "native"


@pytest.fixture
def program(tmp_path):
    exe = tmp_path / "resident_parts"
    subprocess.run(["gcc", "-O1", str(NATIVE / "resident_parts.c"), "-o", str(exe),
                    "-lpthread"], check=True)
    proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


def test_parts_sum_to_smaps_and_name_what_they_are(program):
    import time
    for _ in range(100):  # (until the process's memory held still while it was read, and
        before = resident.totals(program.pid)  # both workers sat in pause(): a thread's stack
        parts = resident.parts(program.pid)    # pointer is read while it waits in a call)
        workers = [p for p in parts if p.name.startswith("thread stack: worker (")]
        if resident.totals(program.pid) == before and len(workers) == 2:
            break
        time.sleep(0.05)
    for f in ("Rss", "Private_Dirty", "Swap"):
        assert sum(p.bytes[f] for p in parts) == before[f], f
    # smaps_rollup sums Pss before rounding each mapping's down to a kB
    regions = sum(p.regions for p in parts)
    assert 0 <= before["Pss"] - sum(p.bytes["Pss"] for p in parts) < 1024 * regions
    by = {p.name: p for p in parts}
    workers = [p for p in parts if p.name.startswith("thread stack: worker (")]
    assert len(workers) == 2, list(by)
    assert "thread stack: main" in by or any(n.startswith("thread stack: resident_parts")
                                             for n in by), list(by)
    arenas = by["malloc heaps (thread arenas)"]
    assert arenas.bytes["Rss"] >= 2 * 1000 * 1000, arenas
    anonymous = by["anonymous (mmap, malloc's mmapped chunks)"]
    assert 32 << 20 <= anonymous.bytes["Rss"] < 40 << 20, anonymous
    assert by["file: resident_parts"].bytes["Rss"] > 0
    assert [p.bytes["Rss"] for p in parts] == sorted((p.bytes["Rss"] for p in parts),
                                                     reverse=True)
