"""The hook library's records, byte for byte: a harness loads it in-process (no GDB, no root),
calls memhook_hook_malloc and memhook_hook_free directly, and the records in the ring are read
back by the consumer's decoder (common/record_format.h), under the SSE4.1 comparison and, where
the CPU has it, AVX-512; and the AArch64 build's (its own malloc_entry.S) under qemu-user, with
pointer authentication on (the harness's return addresses signed) and off; and both processors'
musl builds, whose entry reaches its thread's state through a TLS descriptor."""
from __future__ import annotations

import pytest

import harness
from memhook import _native
from memhook.elf import hooks

KIND = {number: name for name, number in _native.RECORD_KINDS.items()}
SIZE_MASK = (1 << 56) - 1
AARCH64_PTR_BITS = 48  # arch::kUserAddressBits there
RING_BYTES, DEPTH = 1 << 16, 32


def cpu_has(flag: str) -> bool:
    with open("/proc/cpuinfo") as f:
        return flag in next(line for line in f if line.startswith("flags")).split()


def records(data: bytes, end: int):
    """(cursor, kind, op, header aux, header, words after the header) for each record in
    [0, end), decoded by the consumer's own decoder (common/record_format.h)."""
    for cursor, kind, op, _, aux, hdr, words in _native.decode_records(data, 0, end):
        assert kind is not None, f"record at {cursor}: malformed ({hdr:#x})"
        yield cursor, KIND[kind], op, aux, hdr, list(words)


@pytest.fixture(params=["sse", "avx512", "aarch64 max", "aarch64 cortex-a57", "musl",
                        "aarch64 max musl"])
def ring(request, tmp_path):
    """Run the harness with the hook library; the ring's records, what the harness printed, and
    the pointer words' pointer bits."""
    if request.param == "avx512" and not cpu_has("avx512vl"):
        pytest.skip("this CPU has no AVX-512VL: memhook_hook_malloc runs its SSE4.1 comparison")
    cpu = request.param.split()[1] if request.param.startswith("aarch64") else None
    stdout, segment = harness.run(tmp_path, "hook_harness.cpp", ring_bytes=RING_BYTES,
                                  depth=DEPTH, sse=request.param in ("sse", "musl"),
                                  aarch64_cpu=cpu, musl=request.param.endswith("musl"))
    said = {}
    for line in stdout.splitlines():
        key, *values = line.split()
        said[key] = [int(v, 0) for v in values]
    assert said["start"] == [0]
    body, write = harness.ring(segment, RING_BYTES, DEPTH)
    return (list(records(body, write)), said, AARCH64_PTR_BITS if cpu else _native.PTR_BITS,
            request.param)


def test_malloc_and_free_records(ring):
    recs, said, ptr_bits, ring_name = ring
    PTR_MASK = (1 << ptr_bits) - 1
    malloc, free = hooks.BY_SYMBOL["malloc"].id, hooks.BY_SYMBOL["free"].id
    malloc_header = 1 | malloc << 8  # kAlloc, malloc, no frames, no dependency
    kinds = [r[1] for r in recs]
    assert kinds == ["time", "thread", "alloc", "alloc", "free", "alloc"], kinds
    assert recs[1][3] > 0  # the writer's tid
    a, b, f, d = recs[2], recs[3], recs[4], recs[5]
    pa, pb, pd = said["ptrs"]
    # glibc hands the freed block back at once; musl's mallocng takes another slot first.
    assert pd == pb or ring_name.endswith("musl"), "glibc's tcache should hand the block back"

    # The first allocation walked its stack: the call site in leaf(), then leaf's and mid's
    # return addresses as the harness itself saw them.
    cursor, _, op, dep, hdr, words = a
    assert op == malloc and dep == 0
    ptr_word, size_word, *frames = words
    assert ptr_word & PTR_MASK == pa and ptr_word >> ptr_bits != 0  # the allocating frame's depth
    assert size_word & SIZE_MASK == 16
    slot_bits = size_word & ~SIZE_MASK
    assert slot_bits != 0, "a walked stack fills a slot"
    assert 0 < frames[0] - said["leaf"][0] < 64
    assert frames[1:3] == [said["leaf_ret"][0], said["mid_ret"][0]]

    # The same stack again: the hand-written record, three words, no frames, no depth bits,
    # the slot's bits; the table entry it replaced belonged to no live block (dependency 0).
    cursor_b, _, op, dep, hdr, words = b
    assert hdr == malloc_header and words == [pb, 16 | slot_bits]

    # The free of that block depends on its allocation: ring 1, the record's cursor / 8.
    cursor_f, _, op, dep, hdr, words = f
    assert op == free and dep == 1 << 32 | cursor_b // 8
    assert words[0] & PTR_MASK == pb

    # The block allocated again (by the hand-written record) depends on the free; a block at a
    # new address, on nothing.
    _, _, op, dep, hdr, words = d
    assert hdr == malloc_header | ((1 << 32 | cursor_f // 8) << 24 if pd == pb else 0)
    assert words == [pd, 16 | slot_bits]
