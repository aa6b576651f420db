"""`memhook run -- CMD`: the program is started held at the one moment when the dynamic loader has
mapped and relocated every library it needs and run none of their constructors, so that the
way in (GDB) can load the hook library and patch the slots before the program's first
allocation: library constructors, the executable's static initializers, main.

The loader tells debuggers that moment itself: it calls _dl_debug_state() (glibc and musl alike)
with r_debug.r_state RT_CONSISTENT once the initial libraries are relocated, before _dl_init
runs a constructor. memhook is the child's tracer only until then (PTRACE_TRACEME, a breakpoint
there, the state read), puts the instruction back and leaves the program stopped (SIGSTOP) at
that function's first byte for GDB to attach to; SIGCONT lets it go once the hooks are in.

Preloading the hook library (LD_PRELOAD) was the other way in: its constructor runs after those
of the program's own libraries (measured: see the README), it would pass into every child the
program starts, and its hooks would differ from those -p patches in."""
from __future__ import annotations

import ctypes
import os
import signal
import struct
import subprocess

from .. import elf, procfs
from ..arch import X86_64
from ..procfs import TargetError

PTRACE_TRACEME, PTRACE_PEEKDATA, PTRACE_POKEDATA = 0, 2, 5
PTRACE_CONT, PTRACE_SINGLESTEP, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 7, 9, 12, 13, 17
PTRACE_SETOPTIONS, PTRACE_O_EXITKILL = 0x4200, 0x100000
AT_BASE = 7          # the auxiliary vector's entry for the interpreter's load address
RT_CONSISTENT = 0    # r_debug.r_state: the link map is complete
R_STATE_OFFSET = 24  # in glibc's struct r_debug and musl's struct debug alike
ARCH = X86_64

_libc = ctypes.CDLL(None, use_errno=True)
_ptrace = _libc.ptrace
_ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_ptrace.restype = ctypes.c_long


class ProgramEnded(TargetError):
    """The program ended before memhook could attach (the loader found no library it needs,
    say): memhook run exits with its code."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


def ptrace(request: int, pid: int = 0, addr: int = 0, data: int = 0) -> int:
    ctypes.set_errno(0)
    r = _ptrace(request, pid, addr, data)
    if r == -1 and ctypes.get_errno():
        e = ctypes.get_errno()
        raise OSError(e, f"ptrace({request}) on PID {pid}: {os.strerror(e)}")
    return r


def start(argv: list[str], mask: set) -> subprocess.Popen:
    """The program started, stopped by its exec (memhook its tracer). Its stdin, stdout, stderr
    and inheritable descriptors are memhook's, its process group memhook's (a terminal's Ctrl-C
    reaches it as it would without memhook), its signal mask `mask` (memhook's before it held
    the signals it passes on)."""
    def in_child():  # between fork and exec
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        ptrace(PTRACE_TRACEME)

    try:
        proc = subprocess.Popen(argv, preexec_fn=in_child, close_fds=False)
    except OSError as e:
        raise TargetError(f"cannot run {argv[0]}: {e.strerror}") from None
    _, status = os.waitpid(proc.pid, 0)
    if not os.WIFSTOPPED(status):
        _ended(proc, status, "as it started")
    if os.WSTOPSIG(status) != signal.SIGTRAP:
        proc.kill()
        proc.wait()
        raise TargetError(f"{argv[0]} did not stop at its start (signal {os.WSTOPSIG(status)})")
    ptrace(PTRACE_SETOPTIONS, proc.pid, 0, PTRACE_O_EXITKILL)  # memhook dies: so does it
    return proc


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _auxv(pid: int) -> dict:
    with open(f"/proc/{pid}/auxv", "rb") as f:
        raw = f.read()
    return dict(struct.iter_unpack("<QQ", raw[:len(raw) // 16 * 16]))


def _loader(pid: int) -> tuple[int, str]:
    """The dynamic loader's load address and its file (through /proc)."""
    base = _auxv(pid).get(AT_BASE, 0)
    if not base:
        raise TargetError("the program is statically linked: there are no calls into libraries "
                          "for memhook to hook")
    m = next((m for m in procfs.read_maps(pid) if m.start == base), None)
    if m is None or not m.path:
        raise TargetError("the program's dynamic loader is not in its mappings")
    return base, f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"


def _regs(pid: int) -> ctypes.Array:
    regs = (ctypes.c_ulong * ARCH.regs_words)()
    ptrace(PTRACE_GETREGS, pid, 0, ctypes.addressof(regs))
    return regs


def _libc_mapped(pid: int) -> bool:
    return any(elf.is_libc(m.path) for m in procfs.read_maps(pid) if m.path)


def hold_before_constructors(proc: subprocess.Popen) -> int:
    """Run the started program until its loader is done, then leave it stopped there, no longer
    traced. Returns where it is held (the loader's _dl_debug_state)."""
    pid = proc.pid
    base, path = _loader(pid)
    # glibc's loader exports its r_debug; musl's (its libc) a pointer to its own
    found = elf.defined_symbols(path, {"_dl_debug_state", "_r_debug", "_dl_debug_addr"})
    musl = "_r_debug" not in found
    if "_dl_debug_state" not in found or not {"_r_debug", "_dl_debug_addr"} & set(found):
        raise TargetError("the program's dynamic loader exports neither _r_debug nor "
                          "_dl_debug_addr beside _dl_debug_state: memhook cannot tell when it "
                          "is done")
    bp = base + found["_dl_debug_state"]
    word = ptrace(PTRACE_PEEKDATA, pid, bp) & 0xFFFFFFFFFFFFFFFF
    insn = int.from_bytes(ARCH.breakpoint_insn, "little")
    mask = (1 << 8 * len(ARCH.breakpoint_insn)) - 1
    trapped = (word & ~mask) | insn
    ptrace(PTRACE_POKEDATA, pid, bp, trapped)
    signo = 0
    while True:
        ptrace(PTRACE_CONT, pid, 0, signo)
        _, status = os.waitpid(pid, 0)
        if not os.WIFSTOPPED(status):
            _ended(proc, status, "before its libraries were loaded")
        signo = os.WSTOPSIG(status)
        if signo != signal.SIGTRAP:
            continue  # its own signal: delivered as it resumes
        signo = 0
        regs = _regs(pid)
        if regs[ARCH.regs_pc] != bp + len(ARCH.breakpoint_insn):
            continue
        regs[ARCH.regs_pc] = bp
        ptrace(PTRACE_SETREGS, pid, 0, ctypes.addressof(regs))
        with procfs.Memory(pid) as mem:  # (musl's pointer is relocated by now, not at exec)
            r_debug = mem.u64(base + found["_dl_debug_addr"]) if musl else \
                base + found["_r_debug"]
            state = mem.u32(r_debug + R_STATE_OFFSET)
        if state == RT_CONSISTENT and (musl or _libc_mapped(pid)):
            break
        # An earlier call (RT_ADD): step over the real instruction, then trap again.
        ptrace(PTRACE_POKEDATA, pid, bp, word)
        step_signal = 0
        while True:
            ptrace(PTRACE_SINGLESTEP, pid, 0, step_signal)
            _, status = os.waitpid(pid, 0)
            if not os.WIFSTOPPED(status):
                _ended(proc, status, "before its libraries were loaded")
            if os.WSTOPSIG(status) == signal.SIGTRAP:
                break
            step_signal = os.WSTOPSIG(status)  # its own: delivered on the step
        ptrace(PTRACE_POKEDATA, pid, bp, trapped)
    ptrace(PTRACE_POKEDATA, pid, bp, word)
    ptrace(PTRACE_DETACH, pid, 0, signal.SIGSTOP)
    _, status = os.waitpid(pid, os.WUNTRACED)  # stopped: no longer traced, not yet running
    if not os.WIFSTOPPED(status):
        _ended(proc, status, "as memhook let it go")
    return bp


def _ended(proc: subprocess.Popen, status: int, when: str) -> None:
    code = proc.returncode = _returncode(status)
    raise ProgramEnded(f"the program ended {when} (" + (
        f"exit code {code})" if code >= 0 else f"{signal.Signals(-code).name})"),
        code if code >= 0 else 128 - code)
