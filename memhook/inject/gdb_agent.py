# Runs inside GDB's embedded Python (not imported by memhook). memhook prepends PARAMS = {...}:
# an AttachRequest or a DetachRequest (requests.py) as a dict.
# GDB stops every thread on attach; slots are written only while they are stopped, so no thread
# ever reads a half-written pointer. Function calls in the target use raw addresses memhook
# computed from the ELF files, so GDB needs no symbols at all.
import json
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
    zone); the stack pointer is lowered over them for the calls and put back afterwards."""

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
        gdb.execute("set %s = %d" % (self.sp_reg, (self.addrs[0] - 64) & ~align))

    def close(self):
        gdb.execute("set %s = %d" % (self.sp_reg, self.sp))


def record_slot(ctl, P, index, **fields):
    """The target's copy of what was patched (a PatchedSlot, laid out as P["layout"]["slot_fields"] says),
    so that it can restore itself if memhook dies."""
    record = bytearray(P["layout"]["slot_bytes"])
    for name, value in fields.items():
        offset, size = P["layout"]["slot_fields"][name]
        record[offset:offset + size] = int(value).to_bytes(size, "little")
    INF.write_memory(ctl + P["layout"]["slots_offset"] + index * P["layout"]["slot_bytes"], bytes(record))


def slot_field(at, P, name):
    offset, size = P["layout"]["slot_fields"][name]
    return rd(at + offset, size)


def patch(P, base, out):
    ctl = rd(base + P["symbols"]["memhook_ctl"])
    patched, skipped = [], []
    try:
        for addr, hook_off, real, plt, hook_id, readonly in P["slots"]:
            try:
                cur = rd(addr)
            except gdb.MemoryError:
                skipped.append([addr, None])
                continue
            hook = base + hook_off
            if cur == hook and real:
                cur = real  # hooked by an earlier memhook that died: restore to the real one
            if cur == real or any(lo <= cur < hi for lo, hi in plt):
                if len(patched) >= P["layout"]["max_slots"]:
                    skipped.append([addr, cur])
                    continue
                record_slot(ctl, P, len(patched), addr=addr, original=cur, hook=hook,
                            hook_id=hook_id, state=P["layout"]["slot_patched"], readonly=readonly)
                wr(addr, hook)
                patched.append([addr, cur, hook])
            else:
                skipped.append([addr, cur])
        wr(ctl + P["layout"]["nslots_offset"], len(patched), 4)
    except BaseException:
        for addr, original, _ in patched:  # leave nothing half-done
            wr(addr, original)
        raise
    out["patched"], out["skipped"] = patched, skipped


def pick_thread(P):
    """A thread that holds no allocator or loader lock, to run dlopen on: one stopped right
    after a syscall instruction (blocked in the kernel), or one running outside libc and the
    dynamic loader. The main thread is preferred."""
    for th in sorted(INF.threads(), key=lambda t: t.num):
        th.switch()
        pc = int(gdb.parse_and_eval(P["arch"]["gdb_pc"]))
        if any(lo <= pc < hi for lo, hi in P["loader_text"]):
            continue
        try:
            after_syscall = rd(pc - 2, 2) == 0x050F
        except gdb.MemoryError:
            after_syscall = False
        if after_syscall or not any(lo <= pc < hi for lo, hi in P["libc_text"]):
            return th
    raise RuntimeError("busy: every thread is inside libc or the dynamic loader right now")


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
    if not base:
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
        rc = call("int(*)(long)", base + sym["memhook_start"], scratch.addrs[1])
        if rc == -5:
            raise RuntimeError("this CPU lacks SSE4.1, which memhook's malloc hook needs")
        if rc != 0:
            raise RuntimeError("the hook library could not map the shared segment (code %d)" % rc)
        try:
            patch(P, base, out)
            out["late"] = call("int(*)(void)", base + sym["memhook_rescan"])
        except BaseException:
            wr(base + sym["memhook_active"], P["layout"]["mode_off"], 4)
            raise
    finally:
        scratch.close()


def do_detach(P, out):
    sym = P["symbols"]
    base = P["lib_base"]
    wr(base + sym["memhook_active"], P["layout"]["mode_off"], 4)  # every hook passes straight through now
    slots = [tuple(s) for s in P["slots"]]
    ctl = rd(base + sym["memhook_ctl"])
    if ctl:
        nlate = min(rd(ctl + P["layout"]["nlate_offset"], 4), P["layout"]["max_late"])
        for i in range(nlate):
            at = ctl + P["layout"]["late_offset"] + i * P["layout"]["slot_bytes"]
            addr, original, hook, state = (slot_field(at, P, f) for f in
                                           ("addr", "original", "hook", "state"))
            if state == P["layout"]["slot_patched"]:  # still patched, object still loaded
                slots.append((addr, original, hook))
    restored, changed = [], []
    for addr, original, hook in slots:
        try:
            cur = rd(addr)
        except gdb.MemoryError:
            changed.append([addr, None])  # its object was unloaded
            continue
        if cur == hook:
            wr(addr, original)
            restored.append([addr, original])
        else:
            changed.append([addr, cur])
    out["restored"], out["changed"] = restored, changed


def main(P):
    global INF
    out = {}
    try:  # read now, while the target runs, not inside the attach
        gdb.execute("file /proc/%d/exe" % P["pid"], to_string=True)
    except gdb.error:
        pass  # the attach will say why
    t0 = time.monotonic()
    try:
        gdb.execute("attach %d" % P["pid"], to_string=True)
    except gdb.error as e:
        out["error"] = "gdb could not attach: %s" % str(e).strip().rstrip(".")
        if "not permitted" in str(e):
            out["error"] += (" (does kernel.yama.ptrace_scope forbid it, or does memhook lack "
                             "CAP_SYS_PTRACE?)")
        return out
    t_attached = time.monotonic()
    INF = gdb.selected_inferior()
    try:
        (do_attach if P["action"] == "attach" else do_detach)(P, out)
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
