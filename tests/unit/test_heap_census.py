"""The heap census's arithmetic, without a target (memhook/consumer/heap_census.py, resident.py): how a
walk's result becomes a report's numbers, and how the resident table splits by it and still
sums to smaps."""
from __future__ import annotations

import pytest

from memhook.common import resident
from memhook.consumer import heap_census


def heap(lo, live_end, live_bytes, resident_live=0, resident_free=0):
    return {"lo": lo, "hi": lo + (1 << 20), "first": lo, "end": lo, "has_top": True,
            "walked_to": lo, "chunks": 1, "live": (1, live_bytes), "live_end": live_end,
            "last_live": (0, 0, 0), "resident": 0, "resident_live": resident_live,
            "resident_free": resident_free, "problem": ""}


def raw(heaps, types=()):
    arena = {"address": 0x1000, "main": True, "system_mem": 1 << 20, "top": 0,
             "top_bytes": 4096, "top_resident": 4096, "bins": (2, 200), "fastbins": (1, 32),
             "tcache": (3, 96), "largest_free": 160, "trimmable": 0, "uncertain": 0,
             "problems": [], "heaps": heaps}
    return {"problem": "", "arenas": [arena], "mmapped": (1, 8192), "mmapped_resident": 12288,
            "mmapped_unsearched": 0,
            "by_size": [(24, 3, 72), (8184, 1, 8184)], "types": list(types),
            "untyped": (3, 72), "uncertain": 0, "heap_bytes": 1 << 20, "bytes_read": 0,
            "elapsed_ns": 1000}


def test_fragmentation_is_the_theses_mean_and_total():
    """(space - allocated) / space per heap, space ending at its highest live block (trailing
    free space left out): the mean weighs heaps alike, the total by their space."""
    c = heap_census.summarize(raw([heap(0, 1000, 900), heap(1 << 26, (1 << 26) + 3000, 1500)]),
                              [], 0.0)
    assert c["arenas"][0]["heaps"][0]["fragmentation"] == pytest.approx(0.1)
    assert c["fragmentation"]["mean"] == pytest.approx((0.1 + 0.5) / 2)
    assert c["fragmentation"]["total"] == pytest.approx((100 + 1500) / 4000)
    assert c["arenas"][0]["free_bytes"] == 200 + 32 + 96 + 4096


def test_types_are_demangled_and_one_row_per_type():
    """A vtable per module that emits it; one type is one row, named as C++ spells it."""
    types = [(0x10, b"N2ns5OrderE", 0, 5, 200), (0x20, b"N2ns5OrderE", 1, 2, 80),
             (0x30, b"N12_GLOBAL__N_15LocalE", 1, 1, 16)]
    c = heap_census.summarize(raw([heap(0, 1000, 900)], types), ["/bin/a", "/lib/b.so"], 0.0)
    rows = {t["type"]: t for t in c["by_type"]}
    assert rows["ns::Order"]["blocks"] == 7 and rows["ns::Order"]["bytes"] == 280
    assert rows["(anonymous namespace)::Local"]["module"] == "/lib/b.so"



def test_type_rows_read_short_unless_full_names():
    """The text's type rows are a one-line view: a std::vector of std::string reads so; with
    --full-names, as demangled."""
    from memhook.reporters.text import census_lines
    mangled = b"St6vectorINSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESaIS5_EE"
    c = heap_census.summarize(raw([heap(0, 1000, 900)], [(0x10, mangled, 0, 5, 200)]),
                              ["/bin/a"], 0.0)
    full = c["by_type"][0]["type"]
    assert full.startswith("std::vector<std::__cxx11::basic_string<char"), full
    census = {"attach": c}
    assert any("std::vector<std::string> (a)" in x for x in census_lines(census))
    assert any(full[:90] in x for x in census_lines(census, full_names=True))  # (cut at 100)


def test_resident_split_keeps_every_sum():
    """Heap and anonymous parts split by the census's resident bytes; each field of each part
    still sums to what it was, so the table still sums to smaps."""
    parts = [resident.Part("malloc heap (main arena)", "heap", 1,
                           {"Rss": 10000, "Pss": 10000, "Private_Dirty": 9000, "Swap": 0}),
             resident.Part("anonymous (mmap, malloc's mmapped chunks)", "anonymous", 3,
                           {"Rss": 50000, "Pss": 50000, "Private_Dirty": 50000, "Swap": 4096}),
             resident.Part("file: libc.so.6", "file", 4,
                           {"Rss": 700, "Pss": 300, "Private_Dirty": 100, "Swap": 0})]
    census = heap_census.summarize(raw([heap(0, 1000, 900, resident_live=6000,
                                             resident_free=3000)]), [], 0.0)
    split = resident.split_by_census(parts, census)
    by = {p.name: p for p in split}
    assert by["malloc heap: live blocks (main arena)"].bytes["Rss"] == 6000
    assert by["malloc heap: free chunks (main arena)"].bytes["Rss"] == 3000
    assert by["malloc heap: allocator overhead (main arena)"].bytes["Rss"] == 1000
    assert by["malloc's mmapped chunks"].bytes["Rss"] == 12288
    assert by["anonymous (the program's mmap)"].bytes["Rss"] == 50000 - 12288
    for f in resident.FIELDS:
        assert sum(p.bytes[f] for p in split) == sum(p.bytes[f] for p in parts), f
    # No census, or one that failed: the parts as they were.
    assert resident.split_by_census(parts, {"problem": "no glibc"}) == parts
