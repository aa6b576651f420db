"""Entry patching on AArch64 (issue 46): the instruction part of the plan (entry_patch/).

Every A64 instruction is 4 bytes, so the patch is one B (within 128 MiB of the cell) over one
instruction, and the trampoline holds that instruction relocated, then a B back to the next one.
Relocated means: what reads the PC (ADR, ADRP, LDR literal, B, BL, B.cond, CBZ/CBNZ, TBZ/TBNZ)
is rewritten to reach, from the trampoline, what it reached from the function (an absolute
address loaded from a literal beside it, through x16/x17, the registers any call may clobber on
its way to its callee); anything else is copied as it is.

A function that starts with a landing pad keeps it (BTI C, or PACIASP / PACIBSP, which are one
too): on a processor and binary that enforce BTI, an indirect call must land on one. The patch
goes over the second instruction instead; a PACIASP is repeated at the trampoline's start, so that
the function's own AUTIASP checks the return address the hook's call made, and the cell's stub
strips the one the entry signed before the hook runs (hook_cpp/arch/aarch64/cell_code.h).

capstone decodes: each instruction moved must be a valid one, and no branch of the function may
land on the instruction the B replaces (other than its entry: the start is the B, as on x86-64).
"""
from __future__ import annotations

import struct

NEAR = 1 << 27       # B's reach: +-128 MiB
JMP_LEN = 4
LANDING_PADS = {0xd503241f, 0xd503245f, 0xd503249f, 0xd50324df}   # BTI, BTI c, j, jc
SIGNING_PADS = {0xd503233f: "paciasp", 0xd503237f: "pacibsp"}      # sign x30, and land
X16, X17, X30 = 16, 17, 30


class Unrelocatable(Exception):
    """An instruction the trampoline cannot hold (said in one line)."""


def branch(at: int, to: int, link: bool = False) -> int:
    """B (or BL) from `at` to `to`."""
    off = (to - at) >> 2
    if not -(1 << 25) <= off < (1 << 25) or (to - at) & 3:
        raise Unrelocatable(f"{to:#x} is beyond a branch's reach from {at:#x}")
    return (0x94000000 if link else 0x14000000) | (off & 0x03ffffff)


def ldr_literal(rt: int, at: int, literal: int) -> int:
    """LDR Xt, literal: the 8 bytes at `literal` (the instruction at `at`)."""
    return 0x58000000 | ((literal - at) >> 2 & 0x7ffff) << 5 | rt


def br(rn: int) -> int:
    return 0xd61f0000 | rn << 5


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) & 1 else value


def relocate(insn: int, pc: int, at: int, back: int) -> bytes:
    """`insn`, which ran at `pc`, as code at `at` that does the same and then goes on at `back`
    (unless it branches away): 4-byte words, then the literals they load (8-aligned)."""
    words: list = []
    literals: list = []  # (index of the LDR in words, value): resolved once the words are laid out

    def load(rt: int, value: int) -> None:
        literals.append((len(words), value))
        words.append(rt)  # (the register: replaced by the LDR below)

    def go_back() -> None:
        words.append(("b", back))

    if insn & 0x9f000000 == 0x10000000 or insn & 0x9f000000 == 0x90000000:  # ADR, ADRP
        imm = _signed((insn >> 5 & 0x7ffff) << 2 | (insn >> 29 & 3), 21)
        value = pc + imm if not insn >> 31 else (pc & ~0xfff) + (imm << 12)
        load(insn & 31, value & (1 << 64) - 1)
        go_back()
    elif insn & 0x3b000000 == 0x18000000:  # LDR (literal): integer or SIMD&FP, or PRFM
        addr = pc + (_signed(insn >> 5 & 0x7ffff, 19) << 2)
        opc, simd, rt = insn >> 30, insn >> 26 & 1, insn & 31
        if not simd and opc == 3:
            pass  # PRFM (literal): a hint, dropped
        elif not simd:  # through Xt itself: LDR Wt / Xt / LDRSW Xt, [Xt]
            load(rt, addr)
            words.append({0: 0xb9400000, 1: 0xf9400000, 2: 0xb9800000}[opc] | rt << 5 | rt)
        elif opc < 3:  # LDR St / Dt / Qt, [x17]
            load(X17, addr)
            words.append({0: 0xbd400000, 1: 0xfd400000, 2: 0x3dc00000}[opc] | X17 << 5 | rt)
        else:
            raise Unrelocatable(f"an unallocated load literal ({insn:#010x})")
        go_back()
    elif insn & 0x7c000000 == 0x14000000:  # B, BL
        target = pc + (_signed(insn & 0x03ffffff, 26) << 2)
        if insn >> 31:  # BL: x30 is where the call returns, the next instruction of the function
            load(X30, back)
        load(X16, target)
        words.append(br(X16))
    elif (insn & 0xff000010 == 0x54000000 or insn & 0x7e000000 == 0x34000000 or
          insn & 0x7e000000 == 0x36000000):  # B.cond, CBZ/CBNZ, TBZ/TBNZ
        if insn & 0x7e000000 == 0x36000000:  # imm14
            target = pc + (_signed(insn >> 5 & 0x3fff, 14) << 2)
            taken = insn & ~(0x3fff << 5) | 2 << 5
        else:  # imm19
            target = pc + (_signed(insn >> 5 & 0x7ffff, 19) << 2)
            taken = insn & ~(0x7ffff << 5) | 2 << 5
        words.append(taken)  # taken: two words on, to the jump to its target
        go_back()            # not taken
        load(X16, target)
        words.append(br(X16))
    else:
        words.append(insn)
        go_back()
    # Lay out: the words (an LDR placeholder is one word), padded to an 8-byte boundary, then
    # the literals.
    n = len(words) + ((at + 4 * len(words)) & 4) // 4
    out = []
    slot = {i: at + 4 * n + 8 * k for k, (i, _) in enumerate(literals)}
    for i, w in enumerate(words):
        here = at + 4 * i
        if i in slot:
            out.append(ldr_literal(w, here, slot[i]))
        elif isinstance(w, tuple):
            out.append(branch(here, w[1]))
        else:
            out.append(w)
    out += [0xd4200000] * (n - len(words))  # brk #0: padding, never run
    return struct.pack(f"<{len(out)}I", *out) + b"".join(
        struct.pack("<Q", v) for _, v in literals)


def plan(name: str, address: int, size: int, body: bytes, trampoline: int, parts=()) -> tuple:
    """(where the B goes, bytes it replaces, the trampoline's code) for the function at
    `address` (`body`: its code as mapped, `size` bytes by its symbol, or 0). Raises
    Unrelocatable, with why, for a function that cannot be patched."""
    from capstone import CS_ARCH_ARM64, CS_GRP_CALL, CS_GRP_JUMP, CS_MODE_ARM, Cs
    from capstone.arm64 import ARM64_OP_IMM
    if len(body) < 8 or (size and size < 8):
        raise Unrelocatable(f"{name} is shorter than two instructions")
    first, second = struct.unpack_from("<2I", body)
    prefix = b""
    at = address
    if first in LANDING_PADS or first in SIGNING_PADS:
        at = address + 4  # the landing pad stays; the next instruction takes the B
        if first in SIGNING_PADS:
            prefix = struct.pack("<I", first)
    insn = second if at != address else first
    md = Cs(CS_ARCH_ARM64, CS_MODE_ARM)
    md.detail = True
    if not list(md.disasm(struct.pack("<I", insn), at)):
        raise Unrelocatable(f"{name}: the instruction at +{at - address:#x} cannot be decoded")
    if at != address:  # no branch may land on the B's instruction, but for the entry
        end = address + (size or len(body))
        for start, code in [(address, body[:end - address]), *parts]:
            for i in md.disasm(code, start):
                if not (i.group(CS_GRP_JUMP) or i.group(CS_GRP_CALL)):
                    continue
                if any(op.type == ARM64_OP_IMM and op.imm == at for op in i.operands):
                    where = f"+{i.address - address:#x}" if start == address else f"{i.address:#x}"
                    raise Unrelocatable(f"{name}: the branch at {where} lands on the "
                                        "instruction a branch to memhook would replace")
    code = prefix + relocate(insn, at, trampoline + len(prefix), at + 4)
    return at, 4, code
