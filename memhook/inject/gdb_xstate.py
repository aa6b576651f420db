"""GDB on a processor whose kernel enabled AMX (Sapphire Rapids and later).

To call a function in the target GDB saves the calling thread's registers and writes them back
afterwards, the extended ones (AVX, AVX-512) with PTRACE_SETREGSET NT_X86_XSTATE. The kernel takes
that write only whole, as large as the XSAVE area of every feature it enabled: 11,008 bytes with
AMX's tiles. GDB before 14 passes at most 2,696, the kernel answers EFAULT, GDB stops mid-call
("Couldn't write extended state status: Bad address") and a thread blocked in a restartable
system call can come back with ERESTART_RESTARTBLOCK (`sleep` died of it when tried here).

The way around: GDB reads and writes the x87/SSE state with PTRACE_GETFPREGS/SETFPREGS when
PTRACE_GETREGSET of NT_X86_XSTATE fails on its first try. A seccomp filter on GDB's own process
makes exactly that call fail (EIO), nothing else. What GDB then saves and puts back around a call
is x87, MXCSR and xmm0-15, not the upper halves of ymm/zmm nor AVX-512's other registers: so the
agent runs its calls only on a thread stopped where the psABI leaves no vector register live
(right after a system call instruction inside a libc wrapper, or at malloc's entry), never on one
stopped in the middle of the program's own code (gdb_agent.py, pick_thread)."""
from __future__ import annotations

import ctypes
import os
import struct

from .. import _native

GDB_XSTATE_BYTES = 2696  # X86_XSTATE_MAX_SIZE of GDB 13 and older

# seccomp's BPF: ptrace(PTRACE_GETREGSET or PTRACE_SETREGSET, pid, NT_X86_XSTATE, ...) -> EIO.
_LD, _JEQ, _RET = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
_FILTER = [
    (_LD, 0, 0, 4), (_JEQ, 0, 7, 0xC000003E),        # seccomp_data.arch: AUDIT_ARCH_X86_64
    (_LD, 0, 0, 0), (_JEQ, 0, 5, 101),               # .nr: ptrace
    (_LD, 0, 0, 16), (_JEQ, 1, 0, 0x4204), (_JEQ, 0, 2, 0x4205),  # .args[0]: GET/SETREGSET
    (_LD, 0, 0, 32), (_JEQ, 1, 0, 0x202),            # .args[2]: NT_X86_XSTATE
    (_RET, 0, 0, 0x7FFF0000),                        # SECCOMP_RET_ALLOW
    (_RET, 0, 0, 0x00050000 | 5),                    # SECCOMP_RET_ERRNO | EIO
]
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def needs_fpregs() -> bool:
    """Whether GDB must not write this processor's extended state: its XSAVE area is larger
    than GDB before 14 can write. Decided before GDB starts, and whatever GDB's version says
    (a distribution's GDB 13 may carry the fix or not; a GDB that cannot write it harms the
    target the moment it tries: even writing one vector register back as it was left a
    blocked read() returning ERESTART_RESTARTBLOCK). MEMHOOK_GDB_XSTATE=fpregs forces it."""
    if os.environ.get("MEMHOOK_GDB_XSTATE") == "fpregs":
        return True
    return _native.xsave_bytes() > GDB_XSTATE_BYTES


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def hide_xstate():
    """A function for subprocess's preexec_fn that sets the filter above in GDB's process before
    it execs (exec keeps it; as root no PR_SET_NO_NEW_PRIVS is needed). Everything is prepared
    here, in memhook's process: between fork and exec the child only calls prctl."""
    code = b"".join(struct.pack("HBBI", *ins) for ins in _FILTER)
    prog = _Prog(len(_FILTER), code)
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    get_errno = ctypes.get_errno

    def install():
        if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
            raise OSError(get_errno(), "seccomp filter for gdb")
    install.keep = (code, prog)
    return install
