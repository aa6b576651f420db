"""Rows derived from a function's prologue (prologue_rows.py), as unwinder.h reads rows: CFA
rsp + N through pushes and stack adjustments, rbp + N once the frame pointer is set, the
caller's rbp where it was pushed; a prologue that does what no row says gives none. And the
same for A64 code (CFA sp + N, x29 + N once the frame record is set; x29 saved with x30 a word
above it, or x30 alone), as gcc emits it."""
import struct

from memhook.unwind import prologue_rows as pr


def test_pushes_and_an_adjustment_up_to_the_call():
    # musl's strdup: push r12; push rbp; mov rbp, rdi; sub rsp, 8; call strlen
    code = bytes.fromhex("4154" "55" "4889fd" "4883ec08" "e800000000")
    rows = pr.derive(code, 0x1000)
    assert rows == [(0x1000, pr.rule(pr.KIND_RSP, 8)),
                    (0x1002, pr.rule(pr.KIND_RSP, 16)),
                    (0x1003, pr.rule(pr.KIND_RSP, 24, pr.RBP_SAVED, 3)),
                    (0x100a, pr.rule(pr.KIND_RSP, 32, pr.RBP_SAVED, 3))]


def test_a_frame_pointer_set_up():
    # push rbp; mov rbp, rsp; sub rsp, 0x20; call
    rows = pr.derive(bytes.fromhex("55" "4889e5" "4883ec20" "e800000000"), 0x2000)
    assert rows[-1] == (0x2004, pr.rule(pr.KIND_RBP, 16, pr.RBP_SAVED, 2))
    assert rows[1] == (0x2001, pr.rule(pr.KIND_RSP, 16, pr.RBP_SAVED, 2))


def test_what_no_row_says():
    # push rbx; and rsp, -16 (aligned): where the CFA is depends on rsp's value
    assert pr.derive(bytes.fromhex("53" "4883e4f0" "e800000000"), 0x3000) is None
    # a leaf (no call): the rows up to its return
    assert pr.derive(bytes.fromhex("4889f8" "c3"), 0x4000) == [(0x4000, pr.rule(pr.KIND_RSP, 8))]


def a64(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}I", *words)


def test_a64_frame_record_at_the_frames_bottom():
    # paciasp; stp x29, x30, [sp, #-48]!; mov x29, sp; stp x19, x20, [sp, #16];
    # sub sp, sp, #32; bl
    rows = pr.derive_aarch64(a64(0xd503233f, 0xa9bd7bfd, 0x910003fd, 0xa90153f3, 0xd10083ff,
                                 0x97fffffb), 0x1000)
    assert rows == [(0x1000, pr.rule(pr.KIND_RSP, 0)),  # the return address still in x30
                    (0x1008, pr.rule(pr.KIND_RSP, 48, pr.RBP_SAVED, 6)),  # x30 at CFA - 40
                    (0x100c, pr.rule(pr.KIND_RBP, 48, pr.RBP_SAVED, 6))]


def test_a64_frame_record_above_a_large_frame():
    # sub sp, sp, #1, lsl #12; stp x29, x30, [sp, #16]; add x29, sp, #16; bl
    rows = pr.derive_aarch64(a64(0xd14007ff, 0xa9017bfd, 0x910043fd, 0x97fffff7), 0x2000)
    assert rows[1:] == [(0x2004, pr.rule(pr.KIND_RSP, 4096)),
                        (0x2008, pr.rule(pr.KIND_RSP, 4096, pr.RBP_SAVED, 510)),
                        (0x200c, pr.rule(pr.KIND_RBP, 4080, pr.RBP_SAVED, 510))]


def test_a64_return_address_saved_alone():
    # str x30, [sp, #-16]!; sub sp, sp, #32; bl: x30 at CFA - 16, x29 as the caller had it
    rows = pr.derive_aarch64(a64(0xf81f0ffe, 0xd10083ff, 0x97fffff4), 0x3000)
    assert rows[1:] == [(0x3004, pr.rule(pr.KIND_RSP, 16, pr.RBP_SAME, 2)),
                        (0x3008, pr.rule(pr.KIND_RSP, 48, pr.RBP_SAME, 2))]


def test_a64_what_no_row_says():
    # mov x9, sp; and sp, x9, #-64 (aligned); bl
    assert pr.derive_aarch64(a64(0x910003e9, 0x927ae53f, 0x97fffff1), 0x4000) is None
    # a leaf: add x0, x0, #1; ret
    assert pr.derive_aarch64(a64(0x91000400, 0xd65f03c0), 0x5000) == \
        [(0x5000, pr.rule(pr.KIND_RSP, 0))]
