# Runs inside GDB's embedded Python (not imported by memhook). memhook prepends PARAMS = {...}:
# an AttachRequest or a DetachRequest (requests.py) as a dict.
# GDB stops every thread on attach; slots are written only while they are stopped, so no thread
# ever reads a half-written pointer. Function calls in the target use raw addresses memhook
# computed from the ELF files, so GDB needs no symbols at all.
import array
import json
import os
import signal
import threading
import time

import gdb  # noqa: F401  (provided by GDB)

INF = None


def rd(addr, size=8):
    return int.from_bytes(bytes(INF.read_memory(addr, size)), "little")


def wr(addr, value, size=8):
    INF.write_memory(addr, int(value).to_bytes(size, "little"))


def call(signature, fn, *args):
    expr = "((%s) %d)(%s)" % (signature, fn, ", ".join("%d" % a for a in args))
    return int(gdb.parse_and_eval(expr))


class Scratch:
    """Strings for the target, written below the selected thread's stack pointer (past the red
    zone); the stack pointer is lowered over them for the calls and put back afterwards.

    Setting the stack pointer makes GDB find the new innermost frame's caller, and without
    symbols it takes each word from the stack pointer up as a return address to analyse: over a
    stack of text (a PostgreSQL backend's) that was 400-2,200 reads of the target's memory, 1-12
    ms of the pause under load. The 64 bytes at the new stack pointer are zeroed first: a null
    return address ends that search at once."""

    def __init__(self, arch, *strings):
        self.sp_reg, align = arch["gdb_sp"], arch["stack_align"] - 1
        self.sp = int(gdb.parse_and_eval(self.sp_reg))
        at = (self.sp - 2 * arch["red_zone"] - 8192) & ~align
        self.addrs = []
        for s in strings:
            data = s.encode() + b"\0"
            INF.write_memory(at, data)
            self.addrs.append(at)
            at += (len(data) + align) & ~align
        low = (self.addrs[0] - 64) & ~align
        INF.write_memory(low, bytes(self.addrs[0] - low))
        gdb.execute("set %s = %d" % (self.sp_reg, low))

    def close(self):
        gdb.execute("set %s = %d" % (self.sp_reg, self.sp))


def slots_found(P, base):
    """What the hook library did with each slot (hook_library/slots.h): (address, state,
    original, hook) of the planned slots, then of the late ones."""
    L = P["layout"]
    ctl = rd(base + P["symbols"]["memhook_ctl"])
    if not ctl:
        return [], []
    out = []
    fields = [L["slot_fields"][f] for f in ("addr", "state", "original", "hook")]
    for count_at, first_at, most in ((L["nslots_offset"], L["slots_offset"], L["max_slots"]),
                                     (L["nlate_offset"], L["late_offset"], L["max_late"])):
        n = min(rd(ctl + count_at, 4), most)
        # One read for the whole table: a read per field of 181 slots paused a loaded
        # PostgreSQL backend 1-5 ms (benchmarks/pgbench_pause.py).
        table = bytes(INF.read_memory(ctl + first_at, n * L["slot_bytes"])) if n else b""
        rows = []
        for i in range(n):
            row = table[i * L["slot_bytes"]:(i + 1) * L["slot_bytes"]]
            rows.append(tuple(int.from_bytes(row[o:o + size], "little") for o, size in fields))
        out.append(rows)
    return out


def every_signal_blocked(pid, tid):
    """Whether the thread blocks every signal from SIGHUP to SIGSYS that can be blocked, as
    musl's dlopen does while it holds the loader's lock (__block_app_sigs)."""
    try:
        with open("/proc/%d/task/%d/status" % (pid, tid)) as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
    except (OSError, StopIteration, ValueError):
        return True  # unknown: as if inside
    blockable = ((1 << 31) - 1) & ~(1 << 8) & ~(1 << 18)  # 1..31 but SIGKILL, SIGSTOP
    return mask & blockable == blockable


def stopped_after_syscall(P, pc):
    """Whether the selected thread, at `pc`, is stopped right after a system call instruction:
    blocked in the kernel. (On AArch64 the kernel has already rewound the pc of a call it will
    restart to the instruction itself when the stop is reported.)"""
    syscall = bytes.fromhex(P["arch"]["syscall_insn"])
    try:
        if bytes(INF.read_memory(pc - len(syscall), len(syscall))) == syscall:
            return True
        return P["arch"]["syscall_rewound"] and bytes(INF.read_memory(pc, len(syscall))) == syscall
    except gdb.MemoryError:
        return False


def pick_thread(P):
    """A thread that holds no allocator or loader lock, to run dlopen on: one stopped right
    after a syscall instruction (blocked in the kernel), or one running outside libc and the
    dynamic loader. The main thread is preferred."""
    for th in sorted(INF.threads(), key=lambda t: t.num):
        th.switch()
        pc = int(gdb.parse_and_eval(P["arch"]["gdb_pc"]))
        if any(lo <= pc < hi for lo, hi in P["loader_text"]):
            continue
        after_syscall = stopped_after_syscall(P, pc)
        if P["loader_blocks_signals"] and every_signal_blocked(P["pid"], th.ptid[1]):
            continue
        # GDB without the extended state (gdb_xstate.py) puts back no ymm/zmm register after
        # the calls: only a thread where the psABI leaves none live will do.
        in_program = not P["sse_only"] and not any(lo <= pc < hi for lo, hi in P["libc_text"])
        if after_syscall or in_program:
            return th
    raise RuntimeError("busy: every thread is inside libc or the dynamic loader right now")


def quiet_thread(P):
    """For the calls of a detach where GDB puts back no ymm/zmm register (gdb_xstate.py): a
    thread stopped right after a system call instruction, where none is live."""
    for th in sorted(INF.threads(), key=lambda t: t.num):
        th.switch()
        if stopped_after_syscall(P, int(gdb.parse_and_eval(P["arch"]["gdb_pc"]))):
            return th
    raise RuntimeError("busy: no thread is blocked in the kernel right now")


RUNNING = [0.0]  # seconds the target ran (not paused) while the agent waited


def stop_at_allocator_entry(P):
    """Let the target run until one of its threads enters malloc: there it holds no allocator
    lock, so dlopen's own allocations cannot deadlock on it. At most P["entry_wait_s"]."""
    if not P["malloc"]:
        return False
    waiting = [True]

    def interrupt():
        if waiting[0]:  # never once the wait is over: it would cut into the dlopen call
            gdb.execute("interrupt")

    bp = gdb.Breakpoint("*%d" % P["malloc"], internal=True)
    timer = threading.Timer(P["entry_wait_s"], lambda: gdb.post_event(interrupt))
    t0 = time.monotonic()
    timer.start()
    try:
        gdb.execute("continue", to_string=True)
    finally:
        waiting[0] = False
        timer.cancel()
        RUNNING[0] += time.monotonic() - t0
        bp.delete()
    return int(gdb.parse_and_eval(P["arch"]["gdb_pc"])) == P["malloc"]


def unmap_leftovers(P):
    """A dlopen that failed part-way (a segment it could not map) leaves the library's other
    mappings behind: unmap every mapping of the copy, so the target keeps nothing of it."""
    if not P["munmap"]:
        return
    with open("/proc/%d/maps" % P["pid"]) as f:
        spans = [line.split()[0].split("-") for line in f
                 if line.rstrip("\n").split(None, 5)[5:] in ([P["library"]],
                                                              [P["library"] + " (deleted)"])]
    for lo, hi in spans:
        call("int(*)(long, long)", P["munmap"], int(lo, 16), int(hi, 16) - int(lo, 16))


def do_attach(P, out):
    sym = P["symbols"]
    base = P["lib_base"]
    if not base and P.get("at_startup"):
        out["dlopen_at"] = "startup"
    elif not base:
        out["dlopen_at"] = "malloc entry" if stop_at_allocator_entry(P) else "thread %d" % (
            pick_thread(P).num)
    scratch = Scratch(P["arch"], P["library"], P["segment"])
    try:
        if not base:
            handle = call("long(*)(long, int)", P["dlopen"], scratch.addrs[0], P["dlopen_mode"])
            if not handle:
                err = call("long(*)(void)", P["dlerror"]) if P["dlerror"] else 0
                why = (bytes(INF.read_memory(err, 512)).split(b"\0")[0].decode(errors="replace")
                       if err else "unknown error")
                unmap_leftovers(P)
                raise RuntimeError("dlopen failed in the target: %s" % why)
            base = rd(handle)  # struct link_map starts with l_addr
            if rd(base, 4) != 0x464C457F:
                raise RuntimeError("the hook library is not where dlopen said")
        out["lib_base"] = base
        # Without entries, start and patch are one call (each call is a round trip through
        # the scheduler: 0.4 ms idle, up to 4 ms on a loaded host).
        both = not P["entries"]
        rc = call("int(*)(long)", base + sym["memhook_start_and_patch" if both else
                                              "memhook_start"], scratch.addrs[1])
        if rc == -5:
            raise RuntimeError("this CPU lacks SSE4.1, which memhook's malloc hook needs")
        if rc not in (0, -6):
            raise RuntimeError("the hook library could not map the shared segment (code %d)" % rc)
        try:
            if P["entries"]:
                refuse_entries_in_use(P, base)
                if locked_call(base + sym["memhook_patch_entries"]) < 0:
                    raise RuntimeError("the hook library has no session to patch entries for")
            # The hook library patches memhook's plan, then libraries loaded since the scan.
            if not both:
                rc = -6 if call("int(*)(void)", base + sym["memhook_patch"]) < 0 else 0
            if rc == -6:
                raise RuntimeError("the hook library has no session to patch the slots for")
            states = P["layout"]["slot_states"]
            planned, late = slots_found(P, base)
            out["late"] = len(late)
            out["patched"] = [[a, orig, hook] for a, st, orig, hook in planned
                              if st == states["patched"]]
            out["skipped"] = [[a, None if st == states["unreadable"] else orig]
                              for a, st, orig, hook in planned if st != states["patched"]]
            out["entries"] = entry_states(P, base)
            if P.get("embedded_suppressions"):
                out["embedded_suppressions"] = read_string(
                    call("long(*)(void)", P["embedded_suppressions"]))
            if P["read_stats"]:  # (its thread runs once GDB lets the process go)
                out["stats"] = call("int(*)(void)", base + sym["memhook_read_stats"])
        except BaseException:
            leave_nothing_patched(P, base)
            raise
    finally:
        scratch.close()


def read_string(at, limit=1 << 16):
    """A NUL-terminated string of the target's, at most `limit` bytes ("" at NULL)."""
    out = b""
    while at and len(out) < limit:
        try:
            chunk = bytes(INF.read_memory(at + len(out), 256))
        except gdb.MemoryError:
            break
        out += chunk.split(b"\0")[0]
        if b"\0" in chunk:
            break
    return out[:limit].decode(errors="replace")


STACK_SCAN = 256 * 1024  # bytes of each stack searched for return addresses


def entry_state_addresses(P, base):
    """Where each planned entry's state is in the target's control block."""
    L = P["layout"]
    ctl = rd(base + P["symbols"]["memhook_ctl"])
    return [ctl + L["entries_offset"] + i * L["entry_bytes"] + L["entry_state_offset"]
            for i in range(len(P["entries"]))]


def entry_states(P, base):
    """The state the hook library left each planned entry in."""
    return [rd(at, 2) for at in entry_state_addresses(P, base)]


def refuse_entries_in_use(P, base):
    """Every thread is stopped: an entry whose replaced bytes hold a thread's pc, or a return
    address on its stack (the top STACK_SCAN bytes), is marked refused; a thread inside the
    trampoline area refuses them all (an earlier session's trampolines are rewritten)."""
    lo, hi = P["entry_area"]
    # The words that would put an entry in use, each with its entry: one set lookup per stack
    # word, in C (a Python loop over every word paused a target of 9 threads for 130 ms).
    inside = {}
    for i, (addr, length) in enumerate(P["entries"]):
        for w in range(addr + 1, addr + length):
            inside.setdefault(w, set()).add(i)
    busy = set()
    current = gdb.selected_thread()
    try:
        for th in INF.threads():
            th.switch()
            pc = int(gdb.parse_and_eval(P["arch"]["gdb_pc"]))
            sp = int(gdb.parse_and_eval(P["arch"]["gdb_sp"]))
            words = array.array("Q")
            for size in (STACK_SCAN, 4096):  # (a stack nearer its end than that: one page)
                try:
                    words.frombytes(bytes(INF.read_memory(sp, size)))
                    break
                except gdb.MemoryError:
                    continue
            if lo <= pc < hi:
                busy.update(range(len(P["entries"])))
            for w in inside.keys() & ({pc} | set(words)):
                busy.update(inside[w])
    finally:
        current.switch()
    states = entry_state_addresses(P, base)
    for i in busy:
        wr(states[i], P["layout"]["entry_states"]["refused"], 2)


def locked_call(fn):
    """An int(void) call in the target with every other thread held, as GDB's scheduler lock
    does: for the calls that rewrite code (entry patches), which take no lock."""
    gdb.execute("set scheduler-locking on", to_string=True)
    try:
        return call("int(*)(void)", fn)
    finally:
        gdb.execute("set scheduler-locking replay", to_string=True)


def leave_nothing_patched(P, base):
    """An attach that failed after patching: the hook library puts every slot and entry back (its
    own routines, as at detach); if even that fails, its hooks at least pass straight through."""
    try:
        if "memhook_restore_entries" in P["symbols"]:
            locked_call(base + P["symbols"]["memhook_restore_entries"])
        call("int(*)(void)", base + P["symbols"]["memhook_stop"])
    except Exception:  # noqa: BLE001
        wr(base + P["symbols"]["memhook_active"], P["layout"]["mode_off"], 4)


def do_trim(P, out):
    """malloc_trim(0): it takes each arena's lock in turn, so the other threads run meanwhile
    (GDB's default for a call) and the calling thread holds none when it starts."""
    if not stop_at_allocator_entry(P):
        pick_thread(P)
    out["result"] = call("int(*)(long)", P["malloc_trim"], 0)


def do_detach(P, out):
    sym = P["symbols"]
    base = P["lib_base"]
    # Every hook passes straight through from here on, whatever happens next.
    wr(base + sym["memhook_active"], P["layout"]["mode_off"], 4)
    if P["sse_only"]:
        quiet_thread(P)
    if P["read_stats"] and "memhook_read_stats" in sym:
        out["stats"] = call("int(*)(void)", base + sym["memhook_read_stats"])
    # Entry patches first, every other thread held; then every slot that still holds its hook
    # (hook_library/entry_patches.h, slots.h).
    if P["entries"] and "memhook_restore_entries" in sym:
        out["entries_restored"] = locked_call(base + sym["memhook_restore_entries"])
    call("int(*)(void)", base + sym["memhook_stop"])
    states = P["layout"]["slot_states"]
    restored, changed, rebound = [], [], []
    planned, late = slots_found(P, base)
    for addr, state, original, hook in planned + late:
        if state == states["restored"]:
            restored.append([addr, original])
        elif state == states["rebound"]:  # it holds the real function: the loader's binding
            restored.append([addr, rd(addr)])
            rebound.append(addr)
        elif state == states["patched"]:  # it holds something else now, or its page is gone
            try:
                changed.append([addr, rd(addr)])
            except gdb.MemoryError:
                changed.append([addr, None])
    out["restored"], out["changed"], out["rebound"] = restored, changed, rebound


def prime_ptrace():
    """GDB's first attach forks a child to learn which ptrace options the kernel has, and waits
    for it: 3.5 ms on an idle host, 4-33 ms on a loaded one, all of it inside the target's pause.
    An attach to a child of GDB's own first, while the target runs, leaves the real attach
    0.7 ms. (If it fails, the real attach learns the options as before.)"""
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:  # the child: nothing but wait to be killed
        while True:
            signal.pause()
    try:
        gdb.execute("attach %d" % pid, to_string=True)
        gdb.execute("detach", to_string=True)
    except gdb.error:
        pass
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def main(P):
    global INF
    out = {}
    try:  # read now, while the target runs, not inside the attach
        gdb.execute("file /proc/%d/exe" % P["pid"], to_string=True)
    except gdb.error:
        pass  # the attach will say why
    if P.get("at_startup"):  # held by SIGSTOP (startup.py): not a stop to report mid-call
        gdb.execute("handle SIGSTOP nostop noprint nopass", to_string=True)
    prime_ptrace()
    t0 = time.monotonic()
    try:
        gdb.execute("attach %d" % P["pid"], to_string=True)
    except gdb.error as e:
        out["error"] = "gdb could not attach: %s" % str(e).strip().rstrip(".")
        out["ptrace_refused"] = "not permitted" in str(e)  # memhook says why (procfs.py)
        return out
    t_attached = time.monotonic()
    INF = gdb.selected_inferior()
    try:
        {"attach": do_attach, "detach": do_detach, "trim": do_trim}[P["action"]](P, out)
    except Exception as e:  # reported to memhook, which prints one line
        out["error"] = str(e)
    finally:
        t_work = time.monotonic()
        try:
            gdb.execute("detach", to_string=True)
        except gdb.error as e:
            out["detach_error"] = str(e)
        t1 = time.monotonic()
        out["paused_ms"] = (t1 - t0 - RUNNING[0]) * 1000.0
        out["ran_ms"] = RUNNING[0] * 1000.0
        out["attach_ms"] = (t_attached - t0) * 1000.0
        out["work_ms"] = (t_work - t_attached) * 1000.0
    return out


print("MEMHOOK_RESULT " + json.dumps(main(PARAMS)))  # noqa: F821
