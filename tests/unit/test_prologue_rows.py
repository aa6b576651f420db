"""Rows derived from a function's prologue (prologue_rows.py), as unwinder.h reads rows: CFA
rsp + N through pushes and stack adjustments, rbp + N once the frame pointer is set, the
caller's rbp where it was pushed; a prologue that does what no row says gives none."""
from memhook import prologue_rows as pr


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
