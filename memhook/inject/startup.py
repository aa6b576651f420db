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
import time

from .. import _native
from ..common import procfs
from ..common.arch import HOST
from ..common.procfs import TargetError
from ..elf import slots as elf

PTRACE_TRACEME, PTRACE_PEEKDATA, PTRACE_POKEDATA = 0, 2, 5
PTRACE_CONT, PTRACE_SINGLESTEP, PTRACE_DETACH = 7, 9, 17
PTRACE_GETREGSET, PTRACE_SETREGSET, NT_PRSTATUS = 0x4204, 0x4205, 1  # (every processor has these)
PTRACE_SETOPTIONS, PTRACE_GETEVENTMSG, PTRACE_SEIZE, PTRACE_INTERRUPT = \
    0x4200, 0x4201, 0x4206, 0x4207
PTRACE_O_TRACEFORK, PTRACE_O_TRACEVFORK, PTRACE_O_TRACEEXEC, PTRACE_O_EXITKILL = \
    0x2, 0x4, 0x10, 0x100000
PTRACE_EVENT_FORK, PTRACE_EVENT_VFORK, PTRACE_EVENT_EXEC = 1, 2, 4
WALL = 0x40000000    # waitpid's __WALL: a tracee that is not memhook's child, or not a leader
EXEC_WAIT_S = 30.0   # the hook library's own limit (kForkWaitNs): then it execs untraced
AT_BASE = 7          # the auxiliary vector's entry for the interpreter's load address
AT_ENTRY = 9         # ... for the program's entry point
DT_NEEDED, DT_INIT, DT_INIT_ARRAY, DT_INIT_ARRAYSZ = 1, 12, 25, 27
RT_CONSISTENT = 0    # r_debug.r_state: the link map is complete
R_STATE_OFFSET = 24  # in glibc's struct r_debug and musl's struct debug alike
ARCH = HOST

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


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _regs(pid: int) -> ctypes.Array:
    regs = (ctypes.c_ulong * ARCH.regs_words)()
    io = _Iovec(ctypes.addressof(regs), ctypes.sizeof(regs))
    ptrace(PTRACE_GETREGSET, pid, NT_PRSTATUS, ctypes.addressof(io))
    return regs


def _set_regs(pid: int, regs: ctypes.Array) -> None:
    io = _Iovec(ctypes.addressof(regs), ctypes.sizeof(regs))
    ptrace(PTRACE_SETREGSET, pid, NT_PRSTATUS, ctypes.addressof(io))


def _libc_mapped(pid: int) -> bool:
    return any(elf.is_libc(m.path) for m in procfs.read_maps(pid) if m.path)


def hold_before_constructors(proc: subprocess.Popen) -> int:
    """Run the started program until its libraries are loaded and libc is initialized, then
    leave it stopped there, no longer traced, before any other constructor. Returns where it
    is held."""
    return _hold(proc.pid, proc)


def _hold(pid: int, proc: subprocess.Popen | None) -> int:
    """hold_before_constructors() of a program memhook traces, started by it (`proc`) or caught
    at its exec (--follow-fork: not memhook's child).

    First to the loader's _dl_debug_state() with the link map complete (RT_CONSISTENT): every
    initial library mapped and relocated. Under glibc, then on to the first constructor after
    libc's own, or the program's entry point: loading memhook's library there would run libc's
    constructor early, with the argument count, arguments and environment libc has not saved
    yet (dlopen passes libc's copies), and the program would run with no environment. musl's
    loader sets the environment itself before that point and has no constructor of its own."""
    base, path = _loader(pid)
    # glibc's loader exports its r_debug; musl's (its libc) a pointer to its own
    found = elf.defined_symbols(path, {"_dl_debug_state", "_r_debug", "_dl_debug_addr"})
    musl = "_r_debug" not in found
    if "_dl_debug_state" not in found or not {"_r_debug", "_dl_debug_addr"} & set(found):
        raise TargetError("the program's dynamic loader exports neither _r_debug nor "
                          "_dl_debug_addr beside _dl_debug_state: memhook cannot tell when it "
                          "is done")
    bp = base + found["_dl_debug_state"]

    def consistent() -> bool:
        with procfs.Memory(pid) as mem:  # (musl's pointer is relocated by now, not at exec)
            r_debug = mem.u64(base + found["_dl_debug_addr"]) if musl else \
                base + found["_r_debug"]
            return mem.u32(r_debug + R_STATE_OFFSET) == RT_CONSISTENT and (
                musl or _libc_mapped(pid))
    held = _run_to(pid, proc, [bp], until=consistent)
    if not musl:
        held = _run_to(pid, proc, _constructors_after_libc(pid, base + found["_r_debug"]))
    ptrace(PTRACE_DETACH, pid, 0, signal.SIGSTOP)
    if proc is None:  # (not memhook's child: its stop is seen in /proc)
        deadline = time.monotonic() + 5
        while procfs.state(pid) not in "tT" and time.monotonic() < deadline:
            time.sleep(0.001)
        return held
    _, status = os.waitpid(pid, os.WUNTRACED)  # stopped: no longer traced, not yet running
    if not os.WIFSTOPPED(status):
        _ended(proc, status, "as memhook let it go")
    return held


def _constructors_after_libc(pid: int, r_debug: int) -> list[int]:
    """Where the program may run next once libc's constructor is done: every other library's
    constructors (DT_INIT, DT_INIT_ARRAY) and the executable's, and its entry point. A library
    that needs none (the loader, the vdso) is left out: its constructors may run before libc's."""
    addrs = {_auxv(pid).get(AT_ENTRY, 0)}
    code = [(m.start, m.end) for m in procfs.read_maps(pid) if "x" in m.perms]
    with procfs.Memory(pid) as mem:
        for l_addr, l_ld, l_name in elf.link_map_at(mem, r_debug):
            if not l_ld or (l_name and elf.is_libc(mem.cstring(l_name))):
                continue
            dyn = elf.dynamic_entries(mem, l_ld)
            if DT_NEEDED not in dyn:
                continue
            if DT_INIT in dyn:
                addrs.add(l_addr + dyn[DT_INIT])
            if DT_INIT_ARRAY in dyn:
                array = l_addr + dyn[DT_INIT_ARRAY]
                addrs.update(mem.u64(array + 8 * i)
                             for i in range(min(dyn.get(DT_INIT_ARRAYSZ, 0) // 8, 4096)))
    return sorted(a for a in addrs if any(lo <= a < hi for lo, hi in code))


def _run_to(pid: int, proc: subprocess.Popen | None, addrs: list[int], until=None) -> int:
    """Breakpoints at `addrs`; run until one is reached (and `until()` holds there: else step
    over it and go on); every original byte put back, the program stopped at that address, still
    traced. Returns it. On any error the original bytes are put back too."""
    if not addrs:
        raise TargetError("memhook found nowhere to hold the program before its constructors")
    insn = int.from_bytes(ARCH.breakpoint_insn, "little")
    mask = (1 << 8 * len(ARCH.breakpoint_insn)) - 1
    saved = []  # (addr, word): put back in reverse (two addresses may share a word)
    try:
        for a in addrs:
            word = ptrace(PTRACE_PEEKDATA, pid, a) & 0xFFFFFFFFFFFFFFFF
            saved.append((a, word))
            ptrace(PTRACE_POKEDATA, pid, a, (word & ~mask) | insn)
        while True:
            _run_to_trap(pid, proc, PTRACE_CONT)
            regs = _regs(pid)
            at = regs[ARCH.regs_pc] - (len(ARCH.breakpoint_insn) if ARCH.breakpoint_rewinds else 0)
            if at not in addrs:
                continue
            if ARCH.breakpoint_rewinds:
                regs[ARCH.regs_pc] = at
                _set_regs(pid, regs)
            if until is None or until():
                return at
            # Not yet (an earlier RT_ADD call): step over the real instruction, then trap again.
            word = dict(saved)[at]
            trapped = ptrace(PTRACE_PEEKDATA, pid, at) & 0xFFFFFFFFFFFFFFFF
            ptrace(PTRACE_POKEDATA, pid, at, (trapped & ~mask) | (word & mask))
            _run_to_trap(pid, proc, PTRACE_SINGLESTEP)
            ptrace(PTRACE_POKEDATA, pid, at, trapped)
    finally:  # (never left behind in a program that runs on)
        for a, word in reversed(saved):
            try:
                ptrace(PTRACE_POKEDATA, pid, a, word)
            except OSError:
                pass


def _run_to_trap(pid: int, proc: subprocess.Popen | None, request: int) -> None:
    """PTRACE_CONT or PTRACE_SINGLESTEP until the next SIGTRAP stop; the program's own signals
    are delivered as it goes on."""
    signo = 0
    while True:
        ptrace(request, pid, 0, signo)
        _, status = os.waitpid(pid, WALL)
        if not os.WIFSTOPPED(status):
            _ended(proc, status, "before its libraries were loaded")
        if os.WSTOPSIG(status) == signal.SIGTRAP:
            return
        signo = os.WSTOPSIG(status)


def follow_exec(tid: int, pid: int, consumer) -> bool:
    """--follow-fork: thread `tid` of process `pid` announced an exec and waits
    (hook_library/following.h). Become its tracer, let it exec, and hold the new program where
    its loader is done, stopped and no longer traced. False when the exec failed, or the
    process ended or the thread did not exec in time: memhook has let go of it."""
    ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACEEXEC)
    consumer.exec_go()
    deadline = time.monotonic() + EXEC_WAIT_S
    waited = tid
    while True:
        try:
            got, status = os.waitpid(waited, os.WNOHANG | WALL)
        except ChildProcessError:  # a thread that execs takes the leader's id
            if waited == pid:
                consumer.exec_done()
                return False
            waited = pid
            continue
        if got == 0:
            if consumer.exec_state() == _native.EXEC_FAILED or time.monotonic() > deadline:
                _let_go(tid)
                consumer.exec_done()
                return False
            time.sleep(0.001)
            continue
        if not os.WIFSTOPPED(status):
            return False  # it ended
        if status >> 16 == PTRACE_EVENT_EXEC:
            break
        ptrace(PTRACE_CONT, got, 0, os.WSTOPSIG(status) if status >> 16 == 0 else 0)
    consumer.exec_done()
    try:
        _hold(pid, None)
    except ProgramEnded:
        return False
    except (OSError, TargetError):  # (a static program, a loader memhook cannot read...):
        _let_go(pid, stopped=True)   # it runs on, untraced
        raise
    return True


def follow_spawn(tid: int, consumer) -> int | None:
    """--follow-fork: thread `tid` announced that libc is about to start a program in a child
    (posix_spawn, system, popen: libc's own clone and exec, which no slot reaches). Trace the
    thread until the child exists (traced from its first instruction: PTRACE_O_TRACEVFORK,
    TRACEFORK), let go of the thread, run the child to its exec, and hold the new program where
    its loader is done. Its PID; or None: the call failed before a child existed, or the child
    ended without exec. A child memhook cannot hold is let go (and the error raised)."""
    ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACEEXEC)
    consumer.exec_go()
    deadline = time.monotonic() + EXEC_WAIT_S
    child = None
    try:
        while child is None:
            got, status = os.waitpid(tid, os.WNOHANG | WALL)
            if got == 0:
                if consumer.exec_state() == _native.EXEC_FAILED or time.monotonic() > deadline:
                    _let_go(tid)
                    return None
                time.sleep(0.001)
                continue
            if not os.WIFSTOPPED(status):
                return None  # (its process ended)
            event = status >> 16
            if event in (PTRACE_EVENT_FORK, PTRACE_EVENT_VFORK):
                msg = ctypes.c_ulong()
                ptrace(PTRACE_GETEVENTMSG, tid, 0, ctypes.addressof(msg))
                child = msg.value
                _let_go(tid, stopped=True)
            else:
                ptrace(PTRACE_CONT, tid, 0, os.WSTOPSIG(status) if event == 0 else 0)
    finally:
        consumer.exec_done()
    try:
        while True:  # the child, from its first stop (of its own) to its exec
            _, status = os.waitpid(child, WALL)
            if not os.WIFSTOPPED(status):
                return None  # (its exec failed: it exited)
            event, signo = status >> 16, os.WSTOPSIG(status)
            if event == PTRACE_EVENT_EXEC:
                break
            ptrace(PTRACE_CONT, child, 0, signo if event == 0 and signo != signal.SIGSTOP else 0)
        _hold(child, None)
    except ProgramEnded:
        return None
    except (OSError, TargetError):
        _let_go(child, stopped=True)
        raise
    return child


def _let_go(tid: int, stopped: bool = False) -> None:
    """Stop being the tracer of a thread that runs on (an exec that failed; a program memhook
    could not hold, `stopped` in a ptrace stop)."""
    try:
        if stopped:
            ptrace(PTRACE_DETACH, tid)
            return
        ptrace(PTRACE_INTERRUPT, tid)
        while True:
            _, status = os.waitpid(tid, WALL)
            if not os.WIFSTOPPED(status):
                return
            if status >> 16:  # the interrupt's stop (PTRACE_EVENT_STOP)
                break
            ptrace(PTRACE_CONT, tid, 0, os.WSTOPSIG(status))  # its own signal, delivered
        ptrace(PTRACE_DETACH, tid)
    except (OSError, ChildProcessError):
        pass


def _ended(proc: subprocess.Popen | None, status: int, when: str) -> None:
    code = _returncode(status)
    if proc is not None:
        proc.returncode = code
    raise ProgramEnded(f"the program ended {when} (" + (
        f"exit code {code})" if code >= 0 else f"{signal.Signals(-code).name})"),
        code if code >= 0 else 128 - code)
