"""The consumer against rings written by hand and forged at random (no root, no target): the
target's user can write anything into the shared segment, and the consumer must read nothing
outside a ring, never crash or hang, and keep its totals consistent. Every byte around the ring
data that the reader has no business reading holds a sentinel, so a read outside a ring shows
up in the stacks or blocks the consumer reports."""
from __future__ import annotations

import mmap
import os
import pickle
import signal
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memhook import _native
from memhook.elf import hooks

NRINGS, RING_BYTES, DEPTH = 2, 4096, 8
DRAIN_TIMEOUT_S = 8  # a final drain of two 4 KiB rings takes milliseconds (waits: 2 s at most)
SENTINEL = 0x5E5E_1234_5678_5E5E
PTR_MASK = (1 << _native.PTR_BITS) - 1
ALLOC, FREE, REALLOC, TIME, THREAD = 1, 2, 3, 5, 6
MALLOC, FREE_OP = hooks.BY_SYMBOL["malloc"].id, hooks.BY_SYMBOL["free"].id
LAYOUT = _native.segment_layout(NRINGS, RING_BYTES, DEPTH)


header = _native.record_header  # as the hooks encode it (common/record_format.h)


class Segment:
    """A formatted segment file, mapped; rings written by hand."""

    def __init__(self, path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        _native.format_segment(fd, NRINGS, RING_BYTES, DEPTH, _native.CLOCK_MONOTONIC, 0,
                               2**64 - 1, 0, {}, [], 1000.0, 0, False)
        self.fd = fd
        self.m = mmap.mmap(fd, LAYOUT["segment_bytes"])
        # Sentinels: every ring header's padding and everything after the rings.
        for i in range(NRINGS):
            at = self.ring(i)
            self.m[at + 40:at + 64] = struct.pack("<Q", SENTINEL) * 3
            self.m[at + 72:at + 128] = struct.pack("<Q", SENTINEL) * 7
        rest = LAYOUT["recent_stacks_offset"]
        self.m[rest:] = struct.pack("<Q", SENTINEL) * ((len(self.m) - rest) // 8)

    def ring(self, i):
        return LAYOUT["rings_offset"] + i * LAYOUT["ring_stride"]

    def write_ring(self, i, words, *, at=0, write=None, read=0):
        """`words` at data position `at`; the ring's cursors (write: just past them)."""
        data = self.ring(i) + LAYOUT["ring_header_bytes"]
        raw = struct.pack(f"<{len(words)}Q", *words)
        self.m[data + at:data + at + len(raw)] = raw
        end = at + len(raw) if write is None else write
        struct.pack_into("<Q", self.m, self.ring(i) + 8, end)
        struct.pack_into("<Q", self.m, self.ring(i) + 64, read)

    def write_raw(self, i, raw: bytes, write, read):
        data = self.ring(i) + LAYOUT["ring_header_bytes"]
        self.m[data:data + len(raw)] = raw
        struct.pack_into("<Q", self.m, self.ring(i) + 8, write)
        struct.pack_into("<Q", self.m, self.ring(i) + 64, read)

    def drain(self):
        """A consumer's final drain of what is there: totals, stacks' frames, live blocks. In a
        child process, so that a crash or a hang fails this example instead of the run."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drain, send the results, never return into pytest
            try:
                c = _native.Consumer(self.fd)
                c.drain(final=True)
                offsets, frames = c.stacks()
                out = (c.totals(), [int(f) for f in frames],
                       [int(p) for p in c.live_blocks()["ptr"]])
                os.write(write, pickle.dumps(out))
            finally:
                os._exit(0)
        os.close(write)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read)
            raise AssertionError(f"the consumer's drain did not finish within {DRAIN_TIMEOUT_S} s")
        with os.fdopen(read, "rb") as f:
            data = f.read()
        assert os.WIFEXITED(status) and data, f"the consumer's drain died (status {status:#x})"
        return pickle.loads(data)

    def close(self):
        self.m.close()
        os.close(self.fd)


@pytest.fixture
def segment(tmp_path):
    s = Segment(tmp_path / "segment")
    yield s
    s.close()


def consistent(totals, frames, live):
    assert SENTINEL not in frames, "a frame was read from outside a ring"
    assert SENTINEL & PTR_MASK not in live, "a pointer was read from outside a ring"
    assert totals["outstanding_count"] == len(live)
    # A block allocated again at its address was freed unrecorded: it counts as freed.
    assert totals["alloc_count"] - totals["free_count"] == len(live)
    assert totals["replaced_live_count"] <= totals["free_count"]


def test_hand_written_rings_exactly(segment):
    """Two threads' rings: ring 2 frees a block ring 1 allocated and ring 1 gets it back after
    the free (its allocation depends on it), a realloc, and a repeat of a slot's stack."""
    p, q = 0x10000, 0x20000
    frames = [0x401000, 0x401100, 0x401200]
    slot = 1 << 56  # slot 0
    ring1 = [header(THREAD, aux=101), header(TIME), 1000,
             header(ALLOC, MALLOC, 3), p, 100 | slot, *frames,          # cursor 24: P allocated
             header(ALLOC, MALLOC, 0, 2 << 32 | 0), p, 60 | slot,       # P again, after ring 2's free
             header(REALLOC, 3, 1, 0), q, 300, p, 0, 0x402000]          # P reallocated to Q
    ring2 = [header(FREE, FREE_OP, 0, 1 << 32 | 24 // 8), p]           # frees P (after ring 1's)
    segment.write_ring(1, ring2)
    segment.write_ring(0, ring1)
    totals, got_frames, live = segment.drain()
    consistent(totals, got_frames, live)
    assert (totals["alloc_count"], totals["free_count"]) == (3, 2)
    assert totals["outstanding_bytes"] == 300 and live == [q]
    assert got_frames == frames + [0x402000]
    assert totals["unknown_free_count"] == 0 and totals["unordered_events"] == 0


def test_record_crossing_the_ring_end_is_not_read(segment):
    """An allocation whose frames would run past the ring's last byte ends the ring instead."""
    last = NRINGS - 1
    at = RING_BYTES - 24
    segment.write_ring(last, [header(ALLOC, MALLOC, 4), 0x10000, 8 | 1 << 56], at=at,
                       write=RING_BYTES - 24 + 8 * 7, read=at)
    consistent(*segment.drain())


records = st.one_of(
    st.builds(lambda k, op, n, aux, w: [header(k, op, n, aux), *w],
              st.integers(0, 9), st.integers(0, 255), st.integers(0, 255),
              st.integers(0, 2**40 - 1), st.lists(st.integers(0, 2**64 - 1), max_size=12)),
    st.builds(lambda op, aux, ptr, size, n: [header(ALLOC, op, n, aux), ptr, size,
                                             *[0x400000 + i for i in range(n)]],
              st.integers(0, 40), st.sampled_from([0, 1 << 32, 2 << 32 | 3, 3 << 32, 2**40 - 1]),
              st.integers(1, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 9)),
    st.builds(lambda aux, ptr: [header(FREE, FREE_OP, 0, aux), ptr],
              st.sampled_from([0, 1 << 32 | 3, 2 << 32 | 3]), st.integers(0, 2**64 - 1)),
)
cursors = st.one_of(st.integers(0, 2 * RING_BYTES), st.integers(0, 2**64 - 1),
                    st.integers(2**64 - 2 * RING_BYTES, 2**64 - 1))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(records, max_size=40), cursors, cursors, st.booleans(),
                          st.binary(max_size=RING_BYTES)), min_size=NRINGS, max_size=NRINGS))
def test_forged_rings(tmp_path_factory, rings):
    seg = Segment(tmp_path_factory.mktemp("fuzz") / "segment")
    try:
        for i, (recs, write, read, raw_bytes, raw) in enumerate(rings):
            words = [w & (2**64 - 1) for r in recs for w in r][:RING_BYTES // 8]
            if raw_bytes and raw:
                seg.write_raw(i, raw, write, read)
            else:
                seg.write_ring(i, words, write=write if write % 3 else None, read=read)
        consistent(*seg.drain())
    finally:
        seg.close()


def test_many_stacks_kept_whole_as_their_table_grows(segment):
    """50,000 distinct stacks of 8 frames (3.2 MB of frames: the stack table's array grows from
    1 MiB by moving its pages, three times), written a ring's worth at a time and drained after
    each: every stack's frames come back exactly, in order, whole and from an id on."""
    c = _native.Consumer(segment.fd)
    per = 8
    each = 1 + 2 + per  # an allocation's words
    stacks, start = [], 0
    while len(stacks) < 50_000:
        words = [header(THREAD, aux=7), header(TIME), 1000] if not start else []
        while len(words) + each <= RING_BYTES // 8 and len(stacks) < 50_000:
            n = len(stacks)
            frames = [0x400000 + 16 * (n * per + j) for j in range(per)]
            stacks.append(frames)
            words += [header(ALLOC, MALLOC, per), 0x10000 + 16 * n, 32, *frames]
        segment.write_ring(0, words, write=start + 8 * len(words), read=start)
        c.drain(final=False)
        c.drain(final=False)  # (the first leaves alone the cache line a writer may be filling)
        start += RING_BYTES
    c.drain(final=True)
    assert c.totals()["alloc_count"] == len(stacks)
    offsets, frames = c.stacks()
    got = [frames[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    assert got == [[]] + stacks  # (id 0: no stack)
    offsets, frames = c.stacks(30_001)  # (the ids from 30,001: stacks[30_000:])
    assert frames[offsets[0] - offsets[0]:].tolist()[:per] == stacks[30_000]
    assert len(frames) == per * (len(stacks) - 30_000)
    # In chunks of at most 1,000 frames (a capture's STKS blocks): 125 stacks each, the last
    # one shorter, together every stack once; one stack at a time; none past the last.
    since, chunks = 1, []
    while True:
        offsets, frames = c.stacks(since, 1000)
        if len(offsets) == 1:
            break
        assert len(frames) <= 1000 and offsets[-1] - offsets[0] == len(frames)
        chunks += [frames[offsets[i] - offsets[0]:offsets[i + 1] - offsets[0]].tolist()
                   for i in range(len(offsets) - 1)]
        since += len(offsets) - 1
    assert chunks == stacks
    assert c.stack(1).tolist() == stacks[0] and c.stack(50_000).tolist() == stacks[-1]
    assert c.stack(0).tolist() == [] and c.stack(50_001).tolist() == []
    offsets, frames = c.stacks(49_999, 1)  # (a stack longer than the bound: whole, alone)
    assert offsets.tolist() == [offsets[0], offsets[0] + per] and frames.tolist() == stacks[-2]
