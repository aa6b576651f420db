"""What memhook's Python side knows of the target's processor, in one table keyed by the ELF
header's e_machine: which relocations store a function's address in a slot, and what the GDB
agent needs to call functions in the target (its registers, the red zone below the stack
pointer, the stack's alignment). The native side's seam is hook_cpp/arch/; a memhook build
handles its own processor's programs only (the hook library is that processor's code)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import _native


@dataclass(frozen=True)
class Arch:
    name: str
    e_machine: str      # as pyelftools names it
    red_zone: int       # bytes below the stack pointer a leaf function may use
    stack_align: int
    syscall_insn: str   # the system call instruction's bytes, as hex: a thread stopped right
                        # after one is blocked in the kernel (the GDB agent's thread choice)
    # `memhook run` holds a program where its loader is done (inject/startup.py): a breakpoint
    # instruction, and the words of the general registers (NT_PRSTATUS) with the pc among them
    breakpoint_insn: bytes
    regs_words: int
    regs_pc: int
    breakpoint_rewinds: bool  # the pc after the trap is past the breakpoint (x86's int3)
    # the signal trampoline's code, where a handler returns to (rt_sigreturn): found in an object
    # whose call-frame information does not cover it (AArch64's vDSO, musl's libc), for rows
    sigreturn_code: bytes
    insn_align: int     # where instructions may start
    # a thread stopped in a system call the kernel will restart is shown at the instruction
    # itself (AArch64's do_signal rewinds the pc before the stop), not after it (x86-64)
    syscall_rewound: bool
    gdb_sp: str = "$sp"
    gdb_pc: str = "$pc"
    # The relocations come from hook_cpp/arch/<arch>/arch.h (through the consumer module), the
    # one list the hook library's late patching uses too; read once, for the build's processor.
    # relocation type -> the name memhook reports: those that hold a function's address
    slot_relocations: dict = field(default_factory=lambda: {
        t: name for t, (name, _) in _native.SLOT_RELOCATIONS.items()})
    # of those, the ones that hold it only with a zero addend
    zero_addend: frozenset = field(default_factory=lambda: frozenset(
        t for t, (_, z) in _native.SLOT_RELOCATIONS.items() if z))


X86_64 = Arch("x86-64", "EM_X86_64", red_zone=128, stack_align=16, syscall_insn="0f05",
              breakpoint_insn=b"\xcc", regs_words=27, regs_pc=16,  # user_regs_struct, its rip
              breakpoint_rewinds=True, syscall_rewound=False,
              sigreturn_code=bytes.fromhex("48c7c00f000000" "0f05"),  # mov $15, %rax; syscall
              insn_align=1)

_NOT_YET = "is not yet ported to aarch64 (issue 46)"
AARCH64 = Arch("aarch64", "EM_AARCH64", red_zone=0, stack_align=16,
               syscall_insn="010000d4",                      # svc #0
               breakpoint_insn=(0xd4200000).to_bytes(4, "little"),  # brk #0
               regs_words=34, regs_pc=32,                    # user_pt_regs: x0-x30, sp, pc, pstate
               breakpoint_rewinds=False,                     # (brk leaves the pc at itself)
               syscall_rewound=True,
               sigreturn_code=bytes.fromhex("681180d2" "010000d4"),  # mov x8, #139; svc #0
               insn_align=4)

# The one this build is for.
HOST = {"x86-64": X86_64, "aarch64": AARCH64}[_native.ARCH_NAME]
BY_MACHINE = {HOST.e_machine: HOST}


def of(e_machine: str, elfclass: int) -> Arch | None:
    """The architecture of an ELF file's header, or None where this build has no seam for it."""
    return BY_MACHINE.get(e_machine) if elfclass == 64 else None
