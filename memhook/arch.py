"""What memhook's Python side knows of the target's processor, in one table keyed by the ELF
header's e_machine: which relocations store a function's address in a slot, and what the GDB
agent needs to call functions in the target (its registers, the red zone below the stack
pointer, the stack's alignment). The native side's seam is hook_cpp/arch/."""
from __future__ import annotations

from dataclasses import dataclass

from . import _native


@dataclass(frozen=True)
class Arch:
    name: str
    # relocation type -> the name memhook reports: those that hold a function's address
    slot_relocations: dict
    zero_addend: frozenset  # of those, the ones that hold it only with a zero addend
    red_zone: int       # bytes below the stack pointer a leaf function may use
    stack_align: int
    syscall_insn: str   # the system call instruction's bytes, as hex: a thread stopped right
                        # after one is blocked in the kernel (the GDB agent's thread choice)
    gdb_sp: str = "$sp"
    gdb_pc: str = "$pc"
    # `memhook run` holds a program where its loader is done (inject/startup.py): a breakpoint
    # instruction, and where the pc is among the words of ptrace's PTRACE_GETREGS
    breakpoint_insn: bytes = b"\xcc"
    regs_words: int = 27   # struct user_regs_struct
    regs_pc: int = 16      # its rip


# The relocations come from hook_cpp/arch/x86_64/arch.h (through the consumer module), the one
# list the hook library's late patching uses too.
X86_64 = Arch("x86-64",
              slot_relocations={t: name for t, (name, _) in _native.SLOT_RELOCATIONS.items()},
              zero_addend=frozenset(t for t, (_, z) in _native.SLOT_RELOCATIONS.items() if z),
              red_zone=128, stack_align=16, syscall_insn="0f05")

BY_MACHINE = {"EM_X86_64": X86_64}


def of(e_machine: str, elfclass: int) -> Arch | None:
    """The architecture of an ELF file's header, or None where memhook has no seam for it."""
    return BY_MACHINE.get(e_machine) if elfclass == 64 else None
