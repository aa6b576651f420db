"""Unwind rows derived from machine code, for functions no call-frame information covers (musl's
libc.so: 4 FDEs for 1,700 functions; hand-written assembly): each such function's prologue up
to its first call, decoded (x86-64 with iced-x86: pushes, stack adjustments, the frame
pointer's set-up; AArch64 with capstone: the stack adjustments, where x29 and x30 are stored,
the frame record's set-up), gives where its CFA and the caller's frame pointer and return
address are at its call sites, as unwinder.h's rows say it (common/unwind_rows.h). gdb does
the like with its prologue analysers; memhook writes the result into the object's rows (cached
with them by build-id), for the in-process unwinder.

What is derived is a fall-through reading: a function whose stack changes on another path
before a call is read as its first path has it. A function whose prologue does something else
to the stack pointer (aligns it, moves it from another register) is left without rows, as
before."""
from __future__ import annotations

import numpy as np

from .. import _native
from ..common import arch
from ..elf.allocators import ELF64_SYM, STT_FUNC

ROW = np.dtype([("start", "<u4"), ("rule", "<u4")])
KIND_RSP, KIND_RBP, KIND_NONE = 1, 2, 5
RBP_SAME, RBP_SAVED = 0, 1
PROLOGUE_BYTES = 256  # decoded at most, from the function's start
ALIASES = {"fp": "x29", "lr": "x30"}  # (capstone 5 names them so, capstone 4 not)


def rule(kind: int, cfa: int = 0, rbp: int = RBP_SAME, slot: int = 0) -> int:
    return kind | rbp << 3 | slot << 5 | (cfa // 8) << 16


def functions(elf) -> list[tuple[int, int]]:
    """(start, size) of the functions the object's symbol tables define, by start."""
    found = {}
    for name in (".dynsym", ".symtab"):
        s = elf.get_section_by_name(name)
        if s is None or s["sh_entsize"] != ELF64_SYM.itemsize:
            continue
        syms = np.frombuffer(s.data(), dtype=ELF64_SYM)
        keep = ((syms["info"] & 0xF) == STT_FUNC) & (syms["shndx"] != 0) & (syms["size"] > 0)
        for v, n in zip(syms["value"][keep].tolist(), syms["size"][keep].tolist()):
            found[v] = max(found.get(v, 0), n)
    return sorted(found.items())


def derive(code: bytes, start: int) -> list[tuple[int, int]] | None:
    """Rows (address, rule) for the function whose first bytes are `code`, at `start`: one
    where each instruction up to its first call changes the frame. None where its prologue
    does what no row can say. (This build's processor's machine code.)"""
    return (derive_aarch64 if arch.HOST is arch.AARCH64 else derive_x86_64)(code, start)


def derive_aarch64(code: bytes, start: int) -> list[tuple[int, int]] | None:
    """derive() for A64 code: the CFA is sp at the entry (the return address in x30); a frame
    record (stp x29, x30) makes x29 saved at some slot and x30 one word above it (arch.h's
    ra_slot), or x30 is stored alone (its slot with x29 kept); `mov x29, sp` or `add x29, sp,
    #n` make the CFA x29's."""
    from capstone import CS_ARCH_ARM64, CS_GRP_CALL, CS_GRP_JUMP, CS_GRP_RET, CS_MODE_ARM, Cs
    from capstone import arm64 as a
    md = Cs(CS_ARCH_ARM64, CS_MODE_ARM)
    md.detail = True
    depth = 0          # bytes sp went down since the entry
    framed = None      # CFA = x29 + this, once x29 is set from sp
    saved = {}         # "x29"/"x30": where, in bytes below the CFA
    rows = [(start, rule(KIND_RSP, 0))]

    def now(at: int) -> bool:
        s29, s30 = saved.get("x29"), saved.get("x30")
        if s29 is not None and s30 != s29 - 8:
            return False  # x29 saved without x30 above it: no row says it
        kind, cfa = (KIND_RBP, framed) if framed is not None else (KIND_RSP, depth)
        r = rule(kind, cfa, RBP_SAVED, s29 // 8) if s29 is not None else \
            rule(kind, cfa, RBP_SAME, (s30 or 0) // 8)
        if r != rows[-1][1]:
            rows.append((at, r))
        return True

    def imm(op) -> int:
        return op.imm << op.shift.value if op.shift.type == a.ARM64_SFT_LSL else op.imm

    end = start
    for i in md.disasm(code, start):
        end = i.address + i.size
        if i.group(CS_GRP_CALL):
            return rows
        if i.group(CS_GRP_RET) or (i.group(CS_GRP_JUMP) and i.id in (a.ARM64_INS_B, a.ARM64_INS_BR)
                                   and i.cc in (a.ARM64_CC_INVALID, a.ARM64_CC_AL)):
            return rows  # (no call on this path: a tail call or a leaf)
        ops = list(i.operands)
        regs = [ALIASES.get(n, n) for n in (i.reg_name(o.reg) for o in ops
                                             if o.type == a.ARM64_OP_REG)]
        mem = next((o.mem for o in ops if o.type == a.ARM64_OP_MEM), None)
        on_sp = mem is not None and i.reg_name(mem.base) == "sp" and not mem.index
        if i.id in (a.ARM64_INS_STP, a.ARM64_INS_STR) and on_sp:
            moves = getattr(i, "writeback", False)
            if moves and (getattr(i, "post_index", False) or ops[-1].type == a.ARM64_OP_IMM):
                return None  # (post-index: not a prologue's)
            if moves:
                depth -= mem.disp  # pre-index: sp moves first, the stores go at the new sp
            at = depth if moves else depth - mem.disp  # the first register's, below the CFA
            for k, reg in enumerate(regs):
                if reg in ("x29", "x30") and reg not in saved:
                    saved[reg] = at - 8 * k
        elif i.id == a.ARM64_INS_SUB and regs[:2] == ["sp", "sp"] and len(ops) == 3 and \
                ops[2].type == a.ARM64_OP_IMM:
            depth += imm(ops[2])
        elif i.id == a.ARM64_INS_ADD and regs[:2] == ["sp", "sp"] and len(ops) == 3 and \
                ops[2].type == a.ARM64_OP_IMM:
            depth -= imm(ops[2])
        elif regs[:2] == ["x29", "sp"] and framed is None and (
                i.id == a.ARM64_INS_MOV or (i.id == a.ARM64_INS_ADD and len(ops) == 3 and
                                            ops[2].type == a.ARM64_OP_IMM)):
            framed = depth - (imm(ops[2]) if i.id == a.ARM64_INS_ADD else 0)
        elif regs and regs[0] == "sp" and mem is None:
            return None  # sp from elsewhere (aligned, moved): no row says where the CFA is
        elif regs and regs[0] in ("x29", "x30") and mem is None and \
                (regs[0] == "x30" or framed is None):
            return None  # the caller's x29 or the return address changed before a call
        if depth < 0 or depth % 8 or depth > 8 * 0xFFF0:
            return None
        if not now(end):
            return None
    return rows if end > start else None


def derive_x86_64(code: bytes, start: int) -> list[tuple[int, int]] | None:
    """derive() for x86-64 code."""
    from iced_x86 import Code, Decoder, FlowControl, Mnemonic, OpKind, Register
    depth = 0          # bytes pushed or reserved below the return address
    framed = None      # rsp's depth when rbp was set to it (CFA = rbp + 8 + that)
    slot = 0           # the caller's rbp at CFA - 8 * slot (0: not saved)
    rows = [(start, rule(KIND_RSP, 8))]

    def now(at: int) -> None:
        r = rule(KIND_RBP, 8 + framed, RBP_SAVED if slot else RBP_SAME, slot) \
            if framed is not None else rule(KIND_RSP, 8 + depth, RBP_SAVED if slot else RBP_SAME,
                                            slot)
        if r != rows[-1][1]:
            rows.append((at, r))

    for insn in Decoder(64, code, ip=start):
        if insn.code == Code.INVALID:
            return None
        m, end = insn.mnemonic, insn.next_ip
        flow = insn.flow_control
        if flow == FlowControl.CALL or flow == FlowControl.INDIRECT_CALL:
            return rows
        if flow in (FlowControl.RETURN, FlowControl.UNCONDITIONAL_BRANCH,
                    FlowControl.INDIRECT_BRANCH, FlowControl.INTERRUPT, FlowControl.EXCEPTION):
            return rows  # (no call on this path: a tail call or a leaf)
        writes_rsp = insn.op_count and insn.op0_kind == OpKind.REGISTER and \
            insn.op0_register == Register.RSP
        if m == Mnemonic.PUSH:
            if insn.op0_kind == OpKind.REGISTER and insn.op0_register == Register.RBP and \
                    framed is None and not slot:
                slot = (16 + depth) // 8
            depth += 8
        elif m == Mnemonic.POP:
            depth -= 8
        elif writes_rsp and m in (Mnemonic.SUB, Mnemonic.ADD) and \
                insn.op1_kind in (OpKind.IMMEDIATE8TO64, OpKind.IMMEDIATE32TO64, OpKind.IMMEDIATE8,
                                  OpKind.IMMEDIATE32):
            imm = insn.immediate(1)
            imm = imm - (1 << 64) if imm >= 1 << 63 else imm
            depth += imm if m == Mnemonic.SUB else -imm
        elif m == Mnemonic.LEA and writes_rsp and insn.memory_base == Register.RSP and \
                insn.memory_index == Register.NONE:
            disp = insn.memory_displacement
            depth -= disp - (1 << 64) if disp >= 1 << 63 else disp
        elif m == Mnemonic.MOV and insn.op_count == 2 and insn.op0_kind == OpKind.REGISTER and \
                insn.op0_register == Register.RBP and insn.op1_kind == OpKind.REGISTER and \
                insn.op1_register == Register.RSP:
            framed = depth
        elif writes_rsp and framed is None:
            return None  # rsp from elsewhere (aligned, moved): no row says where the CFA is
        if depth < 0 or depth % 8 or depth > 8 * 0xFFF0:
            return None
        now(end)
    return rows


def fill(rows: bytes, elf, read) -> tuple[bytes, list]:
    """`rows` with rows derived for the functions they leave without (a kRowNone over their
    start): (the rows, [(start, end)] of the functions derived). `read(vaddr, n)`: the file's
    bytes at a link-time address."""
    table = np.frombuffer(rows, dtype=ROW)
    if not len(table):
        return rows, []
    # Each function's row, found for all of them at once: one searchsorted per function in the
    # structured array's strided column copied the column each time (a library of 1,000
    # functions 0.2 s, 100 libraries' first report 20 s).
    starts = table["start"].astype(np.int64)
    kinds = (table["rule"] & 7).tolist()
    fns = functions(elf)
    at = np.searchsorted(starts, np.array([f for f, _ in fns], dtype=np.int64),
                         side="right") - 1
    starts = starts.tolist()
    out, derived = [], []
    for (start, size), i in zip(fns, at.tolist()):
        if i < 0 or kinds[i] != KIND_NONE or start >= 1 << 32:
            continue
        nxt = starts[i + 1] if i + 1 < len(starts) else None
        if nxt is not None and nxt < start + size:
            continue  # (rows begin inside it: CFI covers part of it)
        try:
            code = read(start, min(size, PROLOGUE_BYTES))
        except (OSError, ValueError):
            continue
        got = derive(code, start)
        if not got:
            continue
        out += got + [(start + size, rule(KIND_NONE))]
        derived.append((start, start + size))
    if not out:
        return rows, []
    return merge(table, out), derived


def merge(table: np.ndarray, more: list[tuple[int, int]]) -> bytes:
    """An object's rows (`table`, of ROW) with `more` (start, rule) among them, as bytes. Where
    two start at one address, a row that says something wins over a kRowNone (a function's end
    may be another's start: the start's row wins)."""
    merged = {int(s): int(r) for s, r in zip(table["start"].tolist(), table["rule"].tolist())}
    for s, r in more:
        if s not in merged or r & 7 != KIND_NONE:
            merged[s] = r
    new = np.array(sorted(merged.items()), dtype=np.uint32).view(ROW).ravel()
    # Adjacent rows alike say nothing: kept, they cost nothing but bytes.
    assert new.dtype.itemsize == _native.ROW_BYTES
    return new.tobytes()
