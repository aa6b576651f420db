"""Entry patching, planned (issue 32): where calls to an allocation function reach no GOT slot (an
allocator linked into the executable), its first instructions are to become a jump to memhook's
hook, and the hook is to call the original through a trampoline holding those instructions.

Planned here, while the target runs, from its own memory: the function's first instructions
(at least the 5 bytes of a `jmp rel32`) are decoded and relocated to the trampoline's address by
iced-x86's BlockEncoder, which fixes RIP-relative operands and branches; the function's body,
sized by its symbol, is decoded whole, and one whose own branches land inside the patched bytes
is refused. Each function gets a 128-byte cell in an area within +-2 GiB of it: stubs the hook
library writes (it knows its own addresses: a jump to the hook, and in sampling sessions malloc's
and free's sample entries), then the trampoline, which ends with a jump back to the first
instruction not moved.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass

from .. import _native
from ..common import arch
from ..elf.allocators import STT_FUNC

JMP_LEN = 5                        # E9 rel32: what the entry becomes (AArch64: a64.py)
CELL = _native.ENTRY_CELL          # bytes per patched function in the area (segment.h)
STUB = _native.ENTRY_STUB          # the cell's stubs (the hook library writes them), then the
                                   # trampoline
MAX_ORIGINAL = _native.ENTRY_ORIGINAL  # bytes of the function's start the plan keeps
MAX_PATCHES = _native.MAX_ENTRIES  # functions per target
LANDING_PAD = 4 if arch.HOST is arch.AARCH64 else 0  # bytes an AArch64 patch may start after
NEAR = 1 << 31 if arch.HOST is arch.X86_64 else 1 << 27  # the jump's reach: rel32, or B's


class Refused(Exception):
    """Why a function cannot be entry-patched: said in one line, nothing written."""


@dataclass
class EntryPlan:
    name: str
    hook_id: int
    address: int        # the function's entry in the target
    length: int         # bytes replaced by the jump (whole instructions, >= JMP_LEN)
    original: bytes     # the function's first MAX_ORIGINAL bytes as planned
    cell: int           # the cell's address in the area
    trampoline: bytes   # the relocated instructions and the jump back, at cell + STUB
    aliases: tuple = ()  # other names of the same function (tcmalloc's malloc is tc_malloc)

    @property
    def trampoline_address(self) -> int:
        return self.cell + STUB


def plan(name: str, hook_id: int, address: int, size: int, body: bytes, cell: int,
         parts: list = ()) -> EntryPlan:
    """The plan for one function: `body` is its code as mapped at `address` (its symbol's
    `size` bytes; at least MAX_ORIGINAL when the size is unknown). `parts`: (address, code) of
    the pieces the compiler split off it (`name.cold`), which jump back into its body."""
    if arch.HOST is arch.AARCH64:
        return _plan_a64(name, hook_id, address, size, body, cell, parts)
    # (imported here: most attaches patch no entry, and iced-x86 takes 10 ms to import)
    from iced_x86 import BlockEncoder, Code, Decoder, FlowControl, Instruction, OpKind
    branches = (FlowControl.UNCONDITIONAL_BRANCH, FlowControl.CONDITIONAL_BRANCH,
                FlowControl.CALL, FlowControl.XBEGIN_XABORT_XEND)
    near_kinds = (OpKind.NEAR_BRANCH16, OpKind.NEAR_BRANCH32, OpKind.NEAR_BRANCH64)
    if size and size < JMP_LEN:
        raise Refused(f"{name} is {size} bytes long, shorter than the {JMP_LEN}-byte jump")
    if abs(cell - address) >= NEAR - CELL:
        raise Refused(f"{name}: no memory for its trampoline within 2 GiB")
    moved, length = [], 0
    decoder = Decoder(64, body, ip=address)
    for insn in decoder:
        if insn.code == Code.INVALID:
            raise Refused(f"{name}: an instruction at +{insn.ip - address:#x} cannot be decoded")
        moved.append(insn)
        length += insn.len
        if length >= JMP_LEN:
            break
        if insn.flow_control in (FlowControl.RETURN, FlowControl.UNCONDITIONAL_BRANCH,
                                 FlowControl.INDIRECT_BRANCH, FlowControl.INTERRUPT):
            raise Refused(f"{name} ends (or jumps away) within its first {JMP_LEN} bytes")
    if length < JMP_LEN or (size and length > size):
        raise Refused(f"{name} is too short to patch")
    # No branch of the function itself may land inside the bytes the jump replaces (its loop
    # back to the start is fine: the start is the jump).
    end = address + (size or len(body))
    for at, code in [(address, body[:end - address]), *parts]:
        for insn in Decoder(64, code, ip=at):
            if insn.code == Code.INVALID:
                break
            if insn.flow_control in branches and insn.op0_kind in near_kinds:
                target = insn.near_branch_target
                if address < target < address + length:
                    where = f"+{insn.ip - address:#x}" if at == address else f"{insn.ip:#x}"
                    raise Refused(f"{name}: the branch at {where} lands inside the {length} "
                                  "bytes a jump would replace")
    # The moved instructions at the trampoline, then the jump back to the first one not moved.
    back = Instruction.create_branch(Code.JMP_REL32_64, address + length)
    try:
        encoder = BlockEncoder(64)
        encoder.add_many(moved + [back])
        code = encoder.encode(cell + STUB)
    except ValueError as e:  # iced: an operand it cannot reach from the trampoline
        raise Refused(f"{name}: its first instructions cannot be relocated ({e})") from None
    if STUB + len(code) > CELL:
        raise Refused(f"{name}: its relocated instructions take {len(code)} bytes, more than "
                      f"a cell holds")
    return EntryPlan(name, hook_id, address, length, bytes(body[:MAX_ORIGINAL]), cell, code)



def _plan_a64(name: str, hook_id: int, address: int, size: int, body: bytes, cell: int,
              parts) -> EntryPlan:
    from . import a64 as entry_a64
    if abs(cell - address) >= NEAR - CELL:
        raise Refused(f"{name}: no memory for its trampoline within 128 MiB")
    try:
        at, length, code = entry_a64.plan(name, address, size, body, cell + STUB, parts)
    except entry_a64.Unrelocatable as e:
        raise Refused(str(e)) from None
    if STUB + len(code) > CELL:
        raise Refused(f"{name}: its relocated instruction takes {len(code)} bytes, more than "
                      "a cell holds")
    skip = at - address
    return EntryPlan(name, hook_id, at, length, bytes(body[skip:skip + MAX_ORIGINAL]), cell, code)


def area_address(maps, functions: list, size: int, page: int = mmap.PAGESIZE) -> int:
    """A free, page-aligned range of `size` bytes that every function in `functions` reaches
    with a rel32 jump, as close above the highest of them as the mappings allow; 0 if none."""
    lo_fn, hi_fn = min(functions), max(functions)
    spans = sorted((m.start, m.end) for m in maps)
    gaps = [(spans[i][1], spans[i + 1][0]) for i in range(len(spans) - 1)]
    best = 0
    for g_lo, g_hi in gaps:
        start = (g_lo + page - 1) & ~(page - 1)
        if start + size > g_hi:
            continue
        if start + size - lo_fn < NEAR - CELL and hi_fn - start < NEAR - CELL and (
                not best or abs(start - hi_fn) < abs(best - hi_fn)):
            best = start
    return best


def _symbols(elf, names: set) -> tuple:
    """name -> (link-time address, size) of the functions named, from the full symbol table,
    else the dynamic one, sized by .eh_frame where the symbol has no size; and name ->
    [(address, size)] of their split-off `name.cold` parts."""
    from ..elf.slots import named_symbols
    out, parts = {}, {}
    for sec_name in (".symtab", ".dynsym"):
        for name, value, size, info in named_symbols(elf, sec_name, names,
                                                     ".cold" if sec_name == ".symtab" else ""):
            if info & 0xF != STT_FUNC:
                continue
            if name in names:
                out.setdefault(name, (value, size))
            else:  # name.cold...
                parts.setdefault(name.partition(".")[0], []).append((value, size))
    unsized = {at for at, size in out.values() if not size}
    if unsized:  # (hand-written assembly often says no size: its call-frame entry does)
        fde = _fde_sizes(elf, unsized)
        out = {n: (at, size or fde.get(at, 0)) for n, (at, size) in out.items()}
    return out, parts


def _fde_sizes(elf, addresses: set) -> dict:
    """Link-time address -> bytes covered, of the .eh_frame entries that start at `addresses`."""
    from elftools.common.exceptions import DWARFError, ELFError
    from elftools.dwarf.callframe import FDE
    try:
        dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False, follow_links=False)
        if not dwarf.has_EH_CFI():
            return {}
        return {e.header["initial_location"]: e.header["address_range"]
                for e in dwarf.EH_CFI_entries()
                if isinstance(e, FDE) and e.header["initial_location"] in addresses}
    except (DWARFError, ELFError, KeyError, ValueError, TypeError):
        return {}


def plan_object(pid: int, obj, names: list, hook_ids: dict, kept_area: tuple = (0, 0)) -> tuple:
    """Entry patches for `names` (hooked functions `obj`, the executable, defines and calls
    directly): (plans, area address, area bytes, [(name, why refused)]). `kept_area`: the area
    an earlier session's hook library mapped (its cells are planned there again)."""
    from elftools.elf.elffile import ELFFile

    from ..common.procfs import Memory, read_maps
    with open(obj.file, "rb") as f:
        found, split = _symbols(ELFFile(f), set(names))
    by_address: dict = {}  # one patch per function, by its first name in `names`
    aliases: dict = {}
    for name in names:
        if name in found:
            at = obj.bias + found[name][0]
            if at in by_address:
                aliases.setdefault(at, []).append(name)
            else:
                by_address[at] = (name, found[name][1])
    if not by_address:
        return [], 0, 0, []
    ordered = sorted(by_address.items())[:MAX_PATCHES]
    size = (len(ordered) * CELL + mmap.PAGESIZE - 1) & ~(mmap.PAGESIZE - 1)
    maps = read_maps(pid)
    area = kept_area[0] or area_address(maps, [a for a, _ in ordered], size)
    if not area or (kept_area[0] and kept_area[1] < size):
        reach = "2 GiB" if NEAR == 1 << 31 else "128 MiB"
        return [], 0, 0, [(n, f"no free memory for trampolines within {reach} of it")
                          for _, (n, _) in ordered]
    plans, refused = [], []
    with Memory(pid) as mem:
        for i, (address, (name, length)) in enumerate(ordered):
            try:
                body = mem.read(address, max(length, MAX_ORIGINAL + LANDING_PAD))
                parts = [(obj.bias + at, mem.read(obj.bias + at, n))
                         for at, n in split.get(name, []) if n]
                plans.append(plan(name, hook_ids[name], address, length, body, area + i * CELL,
                                  parts))
                plans[-1].aliases = tuple(aliases.get(address, ()))
            except Refused as e:
                refused += [(n, str(e)) for n in (name, *aliases.get(address, ()))]
            except OSError as e:
                refused += [(n, f"its code cannot be read ({e.strerror})")
                            for n in (name, *aliases.get(address, ()))]
    return plans, area, size, refused
