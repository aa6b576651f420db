"""A CPython interpreter in the target: which object holds it (the executable, or libpython),
its version and build, and the layout the hooks read its frames by (python_layouts.py). Found
from the target's files and read from its memory while it runs; nothing is loaded or called in
it. Debug and free-threaded builds keep other layouts: refused in one line."""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError

from ..common import arch
from ..common.procfs import Memory
from ..elf import slots as elf
from ..elf.allocators import STT_FUNC
from . import python_layouts

STT_OBJECT = 1
FUNCTIONS = ("PyGILState_GetThisThreadState", "PyObject_Malloc", "PyMem_Malloc")
OBJECTS = ("PyCode_Type", "PyUnicode_Type", "PyBytes_Type", "PyType_Type", "Py_Version",
           "_PyRuntime")
# Symbols only a debug build (Py_REF_DEBUG) or a free-threaded one (Py_GIL_DISABLED) defines.
DEBUG_SYMBOLS = ("_Py_RefTotal", "_Py_NegativeRefcount", "_Py_GetGlobalRefTotal")
FREE_THREADED_SYMBOLS = ("_Py_MergeZeroLocalRefcount", "_PyObject_MergePerThreadRefcounts")
TP_BASICSIZE = 32  # PyTypeObject.tp_basicsize, after PyObject_VAR_HEAD and tp_name
NAME_VERSION = re.compile(r"python(\d)\.(\d+)")
RODATA_VERSION = re.compile(rb"\x00(3\.(\d{1,2})\.\d{1,2}(?:(?:a|b|rc)\d+)?\+?)\x00")


@dataclass
class Interpreter:
    """What memhook found: `layout` for the hooks (None: no Python frames, `why` says why)."""
    path: str
    version: str = ""
    minor: int = 0
    layout: dict | None = None
    why: str = ""
    allocators_why: str = ""  # why PyObject_Malloc's calls are not traced
    symbols: dict = field(default_factory=dict)

    def describe(self) -> dict:
        d = {"path": self.path, "version": self.version,
             "frames": self.layout is not None and not self.why}
        if self.why:
            d["why"] = self.why
        if self.allocators_why:
            d["allocators_why"] = self.allocators_why
        return d


def _symbols(file, names, kinds) -> dict:
    f, e = elf._open_elf(file)
    with f:
        out = {}
        for table in (".dynsym", ".symtab"):
            for name, value, _, info in elf.named_symbols(e, table, names):
                if info & 0xF in kinds and name not in out:
                    out[name] = value
        rodata = e.get_section_by_name(".rodata")
        out["_rodata"] = rodata.data() if rodata is not None and not out.get("Py_Version") else b""
        return out


def _version(obj, syms: dict, mem: Memory) -> tuple[str, int]:
    if "Py_Version" in syms:  # 3.11 on: PY_VERSION_HEX
        hexv = mem.u32(obj.bias + syms["Py_Version"])
        major, minor, micro = hexv >> 24, hexv >> 16 & 0xFF, hexv >> 8 & 0xFF
        level = {0xA: "a", 0xB: "b", 0xC: "rc"}.get(hexv >> 4 & 0xF, "")
        serial = str(hexv & 0xF) if level else ""
        return f"{major}.{minor}.{micro}{level}{serial}", minor if major == 3 else 0
    for m in RODATA_VERSION.finditer(syms.get("_rodata", b"")):
        return m.group(1).decode(), int(m.group(2))
    m = NAME_VERSION.search(os.path.basename(obj.path))
    return (f"{m.group(1)}.{m.group(2)}", int(m.group(2)) if m.group(1) == "3" else 0) if m \
        else ("", 0)


def find(pid: int, objects: list) -> Interpreter | None:
    """The interpreter among the target's loaded objects (elf.LoadedObject), or None."""
    for obj in objects:
        if obj.skip == "memhook's own library" or not obj.file:
            continue
        try:
            syms = _symbols(obj.file, FUNCTIONS + OBJECTS + DEBUG_SYMBOLS + FREE_THREADED_SYMBOLS,
                            (STT_FUNC, STT_OBJECT))
        except (OSError, ELFError, ValueError, KeyError):
            continue
        if not all(n in syms for n in FUNCTIONS[:1] + OBJECTS[:4]):
            continue
        with Memory(pid) as mem:
            return _examine(obj, syms, mem)
    return None


def _examine(obj, syms: dict, mem: Memory) -> Interpreter:
    found = Interpreter(obj.path)
    found.version, found.minor = _version(obj, syms, mem)
    name = f"CPython {found.version or '(version unknown)'}"
    if any(s in syms for s in FREE_THREADED_SYMBOLS):
        found.why = f"{name} is a free-threaded build: memhook reads the frames of GIL builds"
        return found
    if any(s in syms for s in DEBUG_SYMBOLS):
        found.why = f"{name} is a debug build: memhook reads the frames of release builds"
        return found
    if found.minor not in python_layouts.LAYOUTS:
        found.why = f"{name}: memhook reads the frames of CPython 3.8 to 3.13"
        return found
    table = python_layouts.LAYOUTS[found.minor]
    basicsize = mem.u64(obj.bias + syms["PyCode_Type"] + TP_BASICSIZE)
    if basicsize != table["code_basicsize"]:
        found.why = (f"{name}: its code objects are {basicsize} bytes, not the "
                     f"{table['code_basicsize']} of a release build: frames not read")
        return found
    problem = _check_debug_offsets(obj, syms, mem, found.minor) if found.minor >= 13 else ""
    if problem:
        found.why = f"{name}: {problem}: frames not read"
        return found
    found.symbols = {k: obj.bias + v for k, v in syms.items() if not k.startswith("_rodata")}
    allocators = {d: allocator_struct(found.symbols.get(f), mem, (obj.lo, obj.hi))
                  for d, f in (("mem_allocator", "PyMem_Malloc"),
                               ("obj_allocator", "PyObject_Malloc"))}
    if not all(allocators.values()):
        found.allocators_why = ("CPython's allocator structs not found: Python objects are seen "
                                "as pymalloc's arenas only")
        allocators = dict.fromkeys(allocators, 0)
    found.layout = python_layouts.hook_layout(found.minor, {
        "this_thread_state": found.symbols["PyGILState_GetThisThreadState"],
        "code_type": found.symbols["PyCode_Type"],
        "unicode_type": found.symbols["PyUnicode_Type"],
        "bytes_type": found.symbols["PyBytes_Type"],
        "type_type": found.symbols["PyType_Type"], **allocators})
    return found


def allocator_struct(function: int | None, mem: Memory, text: tuple) -> int:
    """The allocator struct (PyMemAllocatorEx) PyObject_Malloc or PyMem_Malloc at `function`
    calls through, found by following its first instructions (a load of _PyRuntime's address
    from the GOT, then loads through it; or loads of the struct itself): where it reads ctx
    and malloc, or malloc alone. 0 when not found, or not a struct of four functions of the
    interpreter's object (`text`: its address range)."""
    if not function:
        return 0
    try:
        code = mem.read(function, 96)
    except OSError:
        return 0
    reads = (_loads_aarch64 if arch.HOST is arch.AARCH64 else _loads_x86_64)(function, code, mem)
    # The struct: ctx and malloc read a word apart; or, where an LTO build reads only the
    # malloc pointer on its way (to compare it with pymalloc's own, ctx read later), that one.
    candidates = [a for a in reads if a + 8 in reads] + [a - 8 for a in reads]
    for at in candidates:
        try:
            words = struct.unpack("<5Q", mem.read(at, 40))
        except (OSError, struct.error):
            continue
        if all(text[0] <= w < text[1] for w in words[1:]):
            return at
    return 0


def _load(regs: dict, reg, at: int, mem: Memory) -> None:
    """A register loaded from `at`: its value where it can be read (a pointer followed later),
    else unknown."""
    try:
        regs[reg] = mem.u64(at)
    except (OSError, struct.error):
        regs.pop(reg, None)


def _loads_x86_64(function: int, code: bytes, mem: Memory) -> list:
    """The addresses the first instructions at `function` load from (iced-x86), registers
    followed through the loads whose address is known."""
    from iced_x86 import Code, Decoder, OpKind, Register
    regs: dict = {}
    reads: list = []
    for n, insn in enumerate(Decoder(64, code, ip=function)):
        if n >= 16 or insn.code == Code.RETNQ:
            break
        at = None
        for i in range(insn.op_count):
            if insn.op_kind(i) != OpKind.MEMORY:
                continue
            if insn.is_ip_rel_memory_operand:
                at = insn.ip_rel_memory_address
            elif insn.memory_base in regs and insn.memory_index == Register.NONE:
                at = (regs[insn.memory_base] + insn.memory_displacement) & (2**64 - 1)
        if at is None:
            if insn.code == Code.MOV_R64_RM64:
                regs.pop(insn.op0_register, None)  # (loaded from where we cannot tell)
            continue
        reads.append(at)
        if insn.code == Code.MOV_R64_RM64:
            _load(regs, insn.op0_register, at, mem)
    return reads


def _loads_aarch64(function: int, code: bytes, mem: Memory) -> list:
    """The same for AArch64 (capstone): an address is built by ADRP (and ADD) or taken from a
    register loaded before, then read by LDR or LDP (Debian's LTO build reads ctx and malloc
    with one LDP from a struct ADRP names; a shared libpython loads _PyRuntime from its GOT)."""
    from capstone import CS_ARCH_ARM64, CS_MODE_ARM, Cs
    from capstone import arm64 as a
    md = Cs(CS_ARCH_ARM64, CS_MODE_ARM)
    md.detail = True
    regs: dict = {}
    reads: list = []
    for n, i in enumerate(md.disasm(code, function)):
        if n >= 16 or i.id == a.ARM64_INS_RET:
            break
        ops = list(i.operands)
        # the registers named (w<n> is x<n>'s low half: written, x<n> is no longer known)
        xs = [re.sub(r"^w(\d+)$", r"x\1.w", i.reg_name(o.reg)) for o in ops
              if o.type == a.ARM64_OP_REG]
        if xs and xs[0].endswith(".w") and i.id not in (a.ARM64_INS_LDR, a.ARM64_INS_LDP):
            regs.pop(xs[0][:-2], None)
        elif i.id in (a.ARM64_INS_ADRP, a.ARM64_INS_ADR) and ops[1].type == a.ARM64_OP_IMM:
            regs[xs[0]] = ops[1].imm
        elif i.id == a.ARM64_INS_ADD and len(ops) == 3 and ops[2].type == a.ARM64_OP_IMM \
                and not ops[2].shift.value and xs[1] in regs:
            regs[xs[0]] = (regs[xs[1]] + ops[2].imm) & (2**64 - 1)
        elif i.id == a.ARM64_INS_MOV and len(xs) == 2 and xs[1] in regs:
            regs[xs[0]] = regs[xs[1]]
        elif i.id in (a.ARM64_INS_LDR, a.ARM64_INS_LDP) and ops[-1].type in (
                a.ARM64_OP_MEM, a.ARM64_OP_IMM) and not getattr(i, "writeback", False):
            last = ops[-1]
            base = i.reg_name(last.mem.base) if last.type == a.ARM64_OP_MEM else None
            at = last.imm if last.type == a.ARM64_OP_IMM else \
                regs[base] + last.mem.disp if base in regs and not last.mem.index else None
            for k, reg in enumerate(xs):  # (the destinations: the base is the operand's)
                if at is None or reg.endswith(".w"):
                    regs.pop(reg.removesuffix(".w"), None)
                    continue
                reads.append(at + 8 * k)
                _load(regs, reg, at + 8 * k, mem)
        else:
            for reg in xs[:1]:
                regs.pop(reg.removesuffix(".w"), None)  # (written by what is not followed)
    return reads


def _check_debug_offsets(obj, syms: dict, mem: Memory, minor: int) -> str:
    """3.13 on: the offsets _PyRuntime states of itself (_Py_DebugOffsets) against the table's."""
    at = obj.bias + syms["_PyRuntime"]
    words = struct.unpack(f"<8s{max(python_layouts.DEBUG_OFFSET_WORDS.values())}Q",
                          mem.read(at, 8 * (1 + max(python_layouts.DEBUG_OFFSET_WORDS.values()))))
    if words[0] != python_layouts.DEBUG_OFFSETS_COOKIE:
        return "its _PyRuntime has no debug offsets"
    if words[python_layouts.DEBUG_OFFSETS_FREE_THREADED]:
        return "a free-threaded build"
    table = python_layouts.LAYOUTS[minor]
    differ = [k for k, i in python_layouts.DEBUG_OFFSET_WORDS.items() if words[i] != table[k]]
    return f"its debug offsets differ from 3.{minor}'s ({', '.join(differ)})" if differ else ""
