"""One profiling session: attach (prepare, the way in, start), drain, detach (restore, final
drain). The way in (GDB today, memhook/inject/) is a seam: prepare() and start() do not know
which one it is."""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from importlib import resources

from .. import _native, entry_patch
from ..common import arch, procfs, resident
from ..common.procfs import TargetError
from ..elf import allocators
from ..elf import slots as elf
from ..elf import hooks, module_files
from ..inject import AttachRequest, DetachRequest, python_interpreter, WayIn
from ..inject.gdb import GdbWayIn
from ..inject.target_files import LIBRARY_DIRS, LibraryCopy, Segment, remove_stale
from ..reachability.check import check as check_reachability
from ..unwind import tables as unwind_tables
from ..unwind.tables import UnwindTables
from . import allocator_stats, heap_census

RTLD_NOW, RTLD_NODELETE = 0x2, 0x1000
ENTRY_WAIT_S = 0.5  # how long attach waits for a thread to enter malloc before picking another
MAX_SIZE = 2**64 - 1
# The code area of a Python target (code_records.h): a few hundred bytes per code object met,
# in pages touched only as records are written.
CODE_AREA_BYTES = 64 << 20


@dataclass
class Options:
    depth: int = 32
    min_size: int = 0
    max_size: int = MAX_SIZE
    ring_bytes: int = 4 << 20
    rings: int = 64
    abandon_after_s: float = 5.0  # the target unhooks itself when memhook is silent this long
    sample_rate: int = 0  # 0: every call; else mean bytes between sampled allocations
    library_dir: str = ""  # where the target maps the hook library from ("": the first of
                           # LIBRARY_DIRS not mounted noexec)
    heap_census: bool = True  # walk glibc malloc's heap at attach and detach (heap_census.py)
    follow_forks: bool = False  # --follow-fork: forked children and execs wait for memhook
    max_wait_s: float = 0.010  # a full ring waits this long for room, then drops (0: at once)
    lossless: bool = False  # every event may wait so (else one wait per half ring emptied)
    reachability: bool = True  # the leak check at detach (reachability/check.py)
    max_pause_ms: float = 200.0  # the longest it may stop the target
    check_by: str = "fork"  # fork: read the target's copy; stop: read it stopped (check.py)
    python_frames: bool = True  # a Python process's stacks carry its Python frames
    pymalloc: bool = True  # a Python process's objects are traced one by one, not as arenas

    @property
    def size_filter(self) -> bool:
        return self.min_size > 0 or self.max_size != MAX_SIZE

    def check(self) -> None:
        if not 1 <= self.depth <= _native.MAX_DEPTH:
            raise ValueError(f"--depth must be between 1 and {_native.MAX_DEPTH}")
        if self.min_size < 0 or self.max_size < 0:
            raise ValueError("--min-size and --max-size must not be negative")
        if self.min_size > self.max_size:
            raise ValueError(f"--min-size ({self.min_size}) is larger than --max-size "
                             f"({self.max_size})")
        if self.ring_bytes < 4096 or self.ring_bytes & (self.ring_bytes - 1):
            raise ValueError("--ring-size must be a power of two of at least 4096 bytes")
        if not 1 <= self.rings <= _native.MAX_RINGS:
            raise ValueError(f"--rings must be between 1 and {_native.MAX_RINGS}")
        if self.sample_rate < 0:
            raise ValueError("--sample-rate must not be negative")
        if not 0 <= self.max_wait_s <= _native.MAX_WAIT_NS / 1e9:
            raise ValueError(f"--max-wait must be between 0 and {_native.MAX_WAIT_NS / 1e9:g} s")


# Why the hook library or the GDB agent left a planned entry patch unwritten.
ENTRY_REFUSALS = {
    "refused": "a stopped thread was inside its first bytes (or held a return address there)",
    "changed": "its first bytes were not those planned, or its page could not be made writable",
    "planned": "the hook library did not get to it"}


def check_target(pid: int, launched: bool = False) -> procfs.ProcessInfo:
    """A process GDB can attach to now: alive, running (or held by memhook run), traced by no
    one else."""
    info = procfs.process_info(pid)
    tracer = procfs.tracer(pid)
    if tracer:
        raise TargetError(f"PID {pid} is already traced by PID {tracer} "
                          f"({procfs.command_name(tracer)}): detach that debugger first")
    st = procfs.state(pid)
    if st in "ZX":
        raise TargetError(f"PID {pid} is a zombie: it has exited and runs no code")
    if st in "tT" and not launched:
        raise TargetError(f"PID {pid} is stopped (SIGSTOP or a debugger): "
                          "resume it first (kill -CONT) or detach the other debugger")
    return info


def owning_memhook(pid: int, lib_base: int, lib_file: str) -> int:
    """The memhook whose session is armed in `pid` (the hook library loaded at `lib_base` armed,
    and the memhook its control block names still running: the same PID and start time), or
    0."""
    own = elf.exported_offsets(lib_file)
    with procfs.Memory(pid) as mem:
        active = mem.u32(lib_base + own["memhook_active"]) != _native.MODE_OFF
        ctl = mem.u64(lib_base + own["memhook_ctl"])
        owner = mem.u64(ctl + _native.CONTROL_OWNER_OFFSET) if ctl else 0
        started = mem.u64(ctl + _native.CONTROL_OWNER_OFFSET + 8) if ctl else 0
    if not (active and owner):
        return 0
    try:
        return owner if procfs.start_ticks(owner) == started else 0
    except (OSError, ValueError, IndexError):
        return 0


def hook_library(libc: str = "glibc") -> str:
    """The hook library a target on this libc loads: the glibc build, or the musl build in
    musl/ (built only where musl-gcc was found)."""
    path = resources.files("memhook").joinpath(*(["musl"] if libc == "musl" else []),
                                              elf.HOOK_LIBRARY_NAME)
    if not path.is_file():
        raise TargetError(f"the target uses {libc}, and this memhook was built without its "
                          f"hook library for {libc} (install musl-tools and reinstall memhook)")
    return str(path)


def tsc_usable() -> bool:
    """An invariant TSC orders events across CPUs; otherwise the hooks read CLOCK_MONOTONIC."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "constant_tsc" in flags and "nonstop_tsc" in flags


@dataclass
class AttachPlan:
    """What prepare() made for the way in: the scan, the request, and what is placed in the
    target's file system for it (removed once the way in is done, whatever it did)."""
    layout: elf.Layout
    request: AttachRequest
    copy: LibraryCopy | None
    segment: Segment

    def release(self) -> None:
        if self.copy:
            self.copy.remove()
        self.segment.unlink()


@dataclass
class Session:
    pid: int
    options: Options = field(default_factory=Options)
    info: procfs.ProcessInfo | None = None
    patched: list = field(default_factory=list)     # [addr, original, hook]
    skipped: list = field(default_factory=list)     # (elf.Slot, value) left alone
    skipped_objects: list = field(default_factory=list)
    modules: dict = field(default_factory=dict)
    pause_ms: dict = field(default_factory=dict)
    started_at: float = 0.0
    ended_at: float = 0.0
    end_reason: str = ""
    restored: int = 0
    not_restored: list = field(default_factory=list)
    rebound: list = field(default_factory=list)  # slots the loader bound over the hook
    lib_base: int = 0
    detach_error: str = ""  # the slots could not be restored: the hooks stay, as pass-throughs
    segment: Segment | None = None
    unwind: UnwindTables = field(default_factory=UnwindTables)
    loads_seen: int = 0  # the target's dlopen/dlclose count when the unwind index was last published
    library: str = ""  # the hook library build it loaded (glibc's or musl's)
    abandoned: bool = False  # the target unhooked itself before detach (hooks' abandon())
    libc: str = ""     # the target's libc and its version, as reports name it
    allocators: list = field(default_factory=list)  # allocators.Found: beside libc's
    resident: dict = field(default_factory=dict)  # "attach"/"detach": resident.table()
    census: dict = field(default_factory=dict)  # "attach"/"detach": heap_census.take()
    leaks: dict = field(default_factory=dict)  # the leak check at detach (reachability/check.py)
    mappings: dict = field(default_factory=dict)  # the program's anonymous mappings (mmap hooks)
    vm_hwm: int = 0  # the process's peak RSS (VmHWM) at detach
    clock_at_attach: int = 0  # the consumer's raw clock when tracing began
    stats_reader: tuple | None = None  # allocator_stats.find(): jemalloc's, tcmalloc's, ...
    allocator_stats: dict = field(default_factory=dict)  # "attach"/"detach": what it read
    libc_kind: tuple = ("", "")  # the target's libc and version, for the census
    entry_plans: list = field(default_factory=list)  # (entry_patch.EntryPlan, name -> Found)
    kept_files: set = field(default_factory=set)  # build-ids module_files has handled
    published_modules: frozenset = frozenset()  # the module keys that index covers
    way_in: WayIn | None = None  # how the session got in: detach goes out the same way
    python: python_interpreter.Interpreter | None = None  # a CPython the target runs
    # its code objects' records by number, and how far they were read (capture/python_code.py)
    python_code: dict = field(default_factory=dict)
    code_read: int = 0
    perf_map: object = None  # a JIT runtime's perf map, as read so far (capture/perf_map.py)
    launched: bool = False  # memhook run started it, held before its constructors
    embedded_suppressions: str = ""  # what its __lsan_default_suppressions() returned

    @property
    def consumer(self):
        return self.segment.consumer

    def attach(self, way_in: WayIn | None = None) -> dict:
        """prepare(), then the way in (GDB unless another is given), then start()."""
        plan = self.prepare()
        # The heap as it was before attach, read while the target runs (not in its pause).
        self.take_census("attach")
        way_in = way_in or GdbWayIn()
        self.way_in = way_in
        # Draining from before the first hook can fire: the rings do not fill while the way in
        # is still busy (on a loaded host, seconds), and the heartbeat runs.
        self.consumer.start()
        try:
            result = way_in.attach(plan.request)
        except BaseException:
            self.consumer.stop()
            raise
        finally:
            plan.release()
        return self.start(plan, result)

    def prepare(self) -> "AttachPlan":
        """Everything done while the target runs untouched: checks, the scan for slots, unwind
        rows, the shared segment, the library copy and the request for the way in."""
        self.options.check()
        self.info = check_target(self.pid, self.launched)
        remove_stale(self.pid)
        layout = elf.scan(self.pid, self.info.exe)
        library = self.library = hook_library(layout.libc)
        self.libc = f"{layout.libc} {layout.libc_version}".strip()
        self.libc_kind = (layout.libc, layout.libc_version)
        symbols = elf.exported_offsets(library)
        for loaded in layout.hook_libraries:
            self._refuse_if_attached(*loaded)
        # The copy of this memhook's own library if one is loaded (another build's stays inert):
        # every copy loaded takes the target's static TLS for good, and switching builds back
        # and forth loaded a new one each time until dlopen failed.
        ours = elf.file_build_id(library)
        layout.hook_library_base, layout.hook_library_file = next(
            ((b, f) for b, f in layout.hook_libraries if elf.file_build_id(f) == ours), (0, ""))
        base = layout.hook_library_base
        self.skipped_objects = [(o.path, o.skip) for o in layout.objects
                                if o.skip and o.skip != "memhook's own library"]
        self.allocators = layout.allocators
        plans, area = self._plan_entries(layout)
        self.python = python_interpreter.find(self.pid, layout.objects)
        python_frames = self.python is not None and self.python.layout is not None and \
            self.options.python_frames
        if self.python is not None and self.python.layout is not None:
            if not self.options.python_frames:
                self.python.layout = dict(self.python.layout, this_thread_state=0)  # (allocators)
                self.python.why = "not asked for (--no-python-frames)"
            if not self.options.pymalloc:
                self.python.layout = dict(self.python.layout, mem_allocator=0, obj_allocator=0)
                self.python.allocators_why = ("CPython's allocator not hooked (--no-pymalloc): "
                                              "Python objects are seen as pymalloc's arenas only")
        # Unwind rows for every mapped object, while the target runs (cached by build-id).
        self.modules = elf.modules(self.pid)
        module_files.keep(self.modules.values(), self.kept_files)
        self.unwind.add(self.modules)
        self.segment = Segment(self.info, nrings=self.options.rings,
                               ring_bytes=self.options.ring_bytes, depth=self.options.depth,
                               clock=_native.CLOCK_TSC if tsc_usable() else _native.CLOCK_MONOTONIC,
                               min_size=self.options.min_size, max_size=self.options.max_size,
                               real=layout.real, known=[o.bias for o in layout.objects],
                               sample_rate=self.options.sample_rate,
                               abandon_after_s=self.options.abandon_after_s,
                               # tests run the SSE4.1 comparison on CPUs with AVX-512 too
                               no_avx512=os.environ.get("MEMHOOK_NO_AVX512") == "1",
                               unwind_bytes=self.unwind.area_bytes(),
                               slots=self._plan(layout),
                               entries=[(p.address, p.hook_id, p.cell, p.length,
                                         p.original.ljust(entry_patch.MAX_ORIGINAL, b"\0"),
                                         p.trampoline) for p in plans],
                               entry_area=area,
                               max_wait_ns=round(self.options.max_wait_s * 1e9),
                               lossless=self.options.lossless,
                               python_bytes=CODE_AREA_BYTES if python_frames else 0)
        if self.python is not None and self.python.layout is not None:
            self.consumer.set_python(self.python.layout)
        self.unwind.publish(self.consumer, self.modules)
        self.published_modules = frozenset(self.modules)
        # (before the way in: a forked child runs on as soon as memhook_start has run in it)
        self.consumer.set_follow_forks(self.options.follow_forks)
        self.stats_reader = allocator_stats.find(layout)
        if self.stats_reader and not self.stats_reader[1]:  # the allocator, but no reader
            self.allocator_stats["attach"] = allocator_stats.unreadable(self.stats_reader)
            self.stats_reader = None
        if self.stats_reader:
            kind, address, _ = self.stats_reader
            self.consumer.set_allocator_stats(address, _native.STATS_KINDS[kind])
        copy = None
        try:
            copy = None if base else LibraryCopy(
                self.info, library, (self.options.library_dir,) if self.options.library_dir
                else LIBRARY_DIRS)
            request = AttachRequest(
                pid=self.pid, lib_base=base, library=copy.target_path if copy else "",
                segment=self.segment.target_path, symbols=symbols,
                dlopen=layout.dlopen, dlerror=layout.dlerror, munmap=layout.munmap,
                dlopen_mode=RTLD_NOW | RTLD_NODELETE | layout.dlopen_mode,
                malloc=layout.real.get(hooks.BY_SYMBOL["malloc"].id, 0),
                entry_wait_s=ENTRY_WAIT_S,
                libc_text=[(o.lo, o.hi) for o in layout.objects if o.libc],
                loader_text=[(o.lo, o.hi) for o in layout.objects
                             if o.skip == "the dynamic loader"],
                loader_blocks_signals=layout.libc == "musl",
                entries=[(p.address, p.length) for p in plans],
                entry_area=[area[0], area[0] + area[1]] if plans else [],
                read_stats=self.stats_reader is not None, at_startup=self.launched,
                embedded_suppressions=layout.embedded_suppressions)
        except BaseException:
            if copy:
                copy.remove()
            self.segment.unlink()
            raise
        return AttachPlan(layout, request, copy, self.segment)

    def _plan_entries(self, layout) -> tuple:
        """Entry patches for the hooked functions an executable defines and calls directly
        (entry_patch/); refusals go to each family's line. Returns (plans, (area, bytes))."""
        plans, area = [], (0, 0)
        self.entry_plans = []
        kept_area = (0, 0)
        direct = [f for f in self.allocators if f.hooked and not f.own_calls]
        if layout.hook_library_base and direct:
            offset = elf.exported_offsets(layout.hook_library_file).get("memhook_entry_area")
            if offset is not None:  # (an older memhook's library has none)
                with procfs.Memory(self.pid) as mem:
                    at = layout.hook_library_base + offset
                    kept_area = (mem.u64(at), mem.u64(at + 8))
        for path in dict.fromkeys(f.path for f in direct):  # (one executable: one area)
            families = [f for f in direct if f.path == path]
            obj = next(o for o in layout.objects if o.path == path)
            names = [n for f in families for n in f.hooked]
            planned, at, size, refused = entry_patch.plan_object(
                self.pid, obj, names, {n: allocators.hook_of(n).id for n in names}, kept_area)
            family_of = {n: f for f in families for n in f.hooked}
            for name, why in refused:
                family_of[name].refused.append((name, why))
            if planned and not plans:
                plans, area = planned, (at, size)
                self.entry_plans = [(p, family_of) for p in planned]
        return plans, area

    @staticmethod
    def _plan(layout) -> list:
        """The slots the hook library is to patch (hook_library/slots.h decides, the target
        stopped): address, hook id, real function, the object's PLT (where a slot not yet bound
        points; the whole object where it has none), read-only."""
        plt = {o.path: (min(lo for lo, _ in o.plt), max(hi for _, hi in o.plt)) if o.plt
               else (o.lo, o.hi) for o in layout.objects}
        return [(s.addr, s.hook_id, layout.real.get(s.hook_id, 0), *plt[s.module], s.readonly)
                for s in layout.slots[:_native.MAX_SLOTS]]

    def start(self, plan: "AttachPlan", result: dict) -> dict:
        """After the way in: what it patched and left alone, and the session's clock."""
        self.pause_ms["attach"] = result.get("paused_ms", 0.0)
        if "error" in result:
            self.consumer.stop()
            raise TargetError(result["error"])
        layout = plan.layout
        self.lib_base = result["lib_base"]
        self.patched = result["patched"]
        self.embedded_suppressions = result.get("embedded_suppressions", "")
        by_addr = {s.addr: s for s in layout.slots}
        # A slot holding another object's PLT entry for the same function, whose own slot is
        # patched, is hooked through it (a non-PIE executable that takes malloc's address makes
        # its PLT entry malloc's address for every library): nothing to say about it.
        hooked = {(by_addr[p[0]].module, by_addr[p[0]].symbol) for p in self.patched
                  if p[0] in by_addr}
        plts = [(lo, hi, o.path) for o in layout.objects for lo, hi in o.plt]
        # A slot holding 0 is an unresolved weak reference: nothing calls through it.
        self.skipped = [(by_addr[addr], value) for addr, value in result["skipped"]
                        if value != 0 and not (value is not None and any(
                            lo <= value < hi and (path, by_addr[addr].symbol) in hooked
                            for lo, hi, path in plts))]
        names = {v: k for k, v in _native.ENTRY_STATES.items()}
        for (plan, family_of), state in zip(self.entry_plans, result.get("entries", [])):
            for name in (plan.name, *plan.aliases):  # (aliases may be of another family)
                if names.get(state) in ("patched", "kept"):
                    family_of[name].patched.append(name)
                else:
                    family_of[name].refused.append((name, f"{allocators.shown(name)}: " +
                                                    ENTRY_REFUSALS.get(names.get(state), "?")))
        self.started_at = time.time()
        self.clock_at_attach = self.consumer.now()
        # What the process's memory was made of as tracing began (read while it runs).
        self.resident["attach"] = resident.table(self.pid, self.census.get("attach"))
        if "stats" in result:
            self.allocator_stats["attach"] = allocator_stats.wait_for(self.consumer,
                                                                      self.stats_reader)
        self.poll_loads(rescan=True)
        return result

    def take_census(self, when: str) -> None:
        """The heap census (heap_census.py), kept under `when`; its failure is said, never
        raised: the session goes on without it. The census at attach keeps its blocks, and the
        consumer matches the frees of pointers it never saw allocated to them."""
        if not self.options.heap_census or (self.launched and when == "attach"):
            return  # (a program held before its constructors has allocated nothing)
        other = self.malloc_beside_glibc()
        if other is not None:  # (glibc's arenas then hold only what the loader allocated)
            self.census[when] = {"problem": f"malloc is defined in {os.path.basename(other.path)}"
                                 ", not glibc: the heap census reads glibc's malloc only"}
            return
        try:
            self.census[when], blocks = heap_census.take(self.pid, *self.libc_kind,
                                                         keep_blocks=when == "attach",
                                                         modules=self.modules)
        except (OSError, ValueError, RuntimeError) as e:
            self.census[when] = {"problem": f"the heap census failed: {e}"}
            return
        if blocks is not None:
            self.consumer.match_census(blocks)

    def malloc_beside_glibc(self):
        """The allocator that defines malloc in place of glibc's, if one does (older loaders
        define a malloc of their own: those objects are skipped, not counted)."""
        skipped = {path for path, _ in self.skipped_objects}
        return next((f for f in self.allocators if f.family == allocators.FAMILIES[0][0]
                     and "malloc" in f.names and f.path not in skipped), None)

    def _pins_of_the_session(self) -> None:
        """The live blocks that hold each heap's top at detach, where the session allocated
        them: the stack that did (the consumer's live blocks)."""
        end = self.census.get("detach") or {}
        pins = [h["top_pinned_by"] for a in end.get("arenas", []) for h in a["heaps"]
                if h.get("top_pinned_by")]
        if not pins:
            return
        import numpy as np
        live = self.consumer.live_blocks()
        order = np.argsort(live["ptr"])
        ptrs = live["ptr"][order]
        for pin in pins:
            i = int(np.searchsorted(ptrs, pin["address"]))
            if i < len(ptrs) and int(ptrs[i]) == pin["address"]:
                pin["stack"] = int(live["stack"][order[i]])

    def mappings_now(self) -> dict:
        """The program's anonymous mappings as the consumer holds them (mappings.h): per stack,
        and the ranges mapped now with their stacks."""
        stacks, ranges, unknown = self.consumer.mappings()
        return {"stacks": [dict(zip(("stack", "maps", "mapped_bytes", "unmapped_bytes",
                                     "released_bytes"), row)) for row in stacks],
                "ranges": [list(r) for r in ranges], "unknown_unmapped_bytes": unknown}

    def poll_loads(self, rescan: bool = False) -> bool:
        """Libraries the target loaded or unloaded since the last call: their unwind rows built
        and the hooks' index published again. Cheap when the dlopen hook counted nothing (one
        shared word); `rescan` reads the maps all the same, for libraries loaded some other way
        (glibc's own loads, dlmopen). Publishes only when the mapped objects changed: a new
        index empties the recent stacks."""
        loads = self.consumer.loads()
        if loads == self.loads_seen and not rescan:
            return False
        self.loads_seen = loads
        try:
            self.modules = elf.modules(self.pid, self.modules)
            module_files.keep(self.modules.values(), self.kept_files)
            mapped = {(m.start, m.path) for m in procfs.read_maps(self.pid) if m.offset == 0}
        except OSError:
            return False
        self.consumer.loads_read(loads)  # (a program exiting need not wait for them: exit_check.h)
        keys = frozenset(k for k in self.modules if k in mapped)
        if keys == self.published_modules:
            return False
        self.unwind.add(self.modules)
        self.unwind.publish(self.consumer, {k: m for k, m in self.modules.items() if k in keys})
        self.published_modules = keys
        return True

    def _refuse_if_attached(self, base: int, file: str) -> None:
        """A live memhook session owns the target; one whose memhook died is taken over at once,
        however fresh its last heartbeat."""
        owner = owning_memhook(self.pid, base, file)
        if owner:
            raise TargetError(f"PID {self.pid} is already being traced by memhook (PID {owner}): "
                              "stop that one first")

    def target_alive(self) -> bool:
        return procfs.alive(self.info)

    def target_execed(self) -> bool:
        """The process replaced its program: the hook library and every slot are gone. (A
        process that is exiting has no mappings left at all: that is not an exec.)"""
        if not self.target_alive():
            return False
        try:
            maps = procfs.read_maps(self.pid)
        except OSError:
            return False
        return bool(maps) and not self._library_in(maps)

    def _library_in(self, maps: list) -> bool:
        return any(m.start == self.lib_base and m.offset == 0 and
                   elf.HOOK_LIBRARY_NAME in m.path for m in maps)

    def _library_still_mapped(self) -> bool:
        """After an exec the addresses mean something else: then nothing may be written."""
        try:
            return self._library_in(procfs.read_maps(self.pid))
        except OSError:
            return False

    def detach(self, reason: str) -> None:
        self.end_reason = reason
        self.ended_at = time.time()
        # The target stopped tracing by itself (memhook's heartbeat seemed stopped): say so.
        self.abandoned = self.consumer.abandoned
        if self.target_alive() and self._library_still_mapped():
            if self.options.reachability and not self.leaks:  # (tracing still on: exact)
                self.check_leaks("detach")
            self.modules = elf.modules(self.pid, self.modules)
            module_files.keep(self.modules.values(), self.kept_files)
            request = DetachRequest(pid=self.pid, lib_base=self.lib_base,
                                    symbols=elf.exported_offsets(self.library),
                                    read_stats=self.stats_reader is not None,
                                    entries=bool(self.entry_plans))
            try:
                result = (self.way_in or GdbWayIn()).detach(request)
            except TargetError as e:
                result = {"error": str(e)}
            self.pause_ms["detach"] = result.get("paused_ms", 0.0)
            self.detach_error = result.get("error", "")
            self.restored = len(result.get("restored", []))
            self.not_restored = result.get("changed", [])
            self.rebound = result.get("rebound", [])
            if "stats" in result:
                self.allocator_stats["detach"] = allocator_stats.wait_for(self.consumer,
                                                                          self.stats_reader)
        elif self.options.reachability and not self.leaks:
            self.leaks = {"skipped": "the process ended before a check: killed, or by _exit() "
                          "or exec, which run no exit handlers (memhook checks at exit())"}
        # Hooks already inside the real function finish their record, then the rest is exact.
        deadline = time.monotonic() + 1.0
        while self.consumer.any_busy() and time.monotonic() < deadline and self.target_alive():
            time.sleep(0.001)
        self.consumer.stop()
        self.consumer.drain(final=True)
        self._reconcile()
        self.mappings = self.mappings_now()
        # What the process's memory is made of as tracing ends (read while it runs on: the hook
        # library and the segment stay mapped in it), the consumer at rest.
        if self.target_alive() and self._library_still_mapped():  # (not the program it exec'd)
            self.vm_hwm = procfs.peak_rss(self.pid)
            self.take_census("detach")
            self._pins_of_the_session()
            self.resident["detach"] = resident.table(self.pid, self.census.get("detach"),
                                                     self.mappings["ranges"])
        at = self.census.get("attach")
        if at and not at.get("problem"):
            at["freed_in_session"] = heap_census.freed_in_session(
                at, self.consumer.census_classes())
        self.consumer.release_rings()

    def check_leaks(self, when: str) -> None:
        """The leak check now (reachability/check.py), kept for the capture: at detach, or at
        the program's exit() (it waits in the hook library's destructor: exit_check.h)."""
        self.leaks = check_reachability(self)
        self.leaks["when"] = when
        if when == "exit":
            self.consumer.exit_done()

    def _reconcile(self) -> None:
        """Frees the hooks dropped: the blocks they freed, found in the target's address table
        (Consumer::reconcile), are no longer outstanding. Where the table cannot be read (the
        target exited or exec'd), totals say how many dropped frees went unchecked."""
        if not self.consumer.totals()["dropped_frees"]:
            return
        try:  # the fd stays with this process, whatever happens to the PID afterwards
            fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if self.target_alive() and self._library_still_mapped():
                self.consumer.reconcile(fd)
        finally:
            os.close(fd)

    def jit_state(self) -> dict | None:
        """A JIT runtime (by its library: a JVM's libjvm.so, Node.js's executable or libnode),
        and what its perf map gave (capture/perf_map.py); None for a process with neither."""
        names = {os.path.basename(m.path) for m in self.modules.values()}
        runtime = "jvm" if "libjvm.so" in names else "node" if "node" in names or any(
            n.startswith("libnode.so") for n in names) else ""
        m = self.perf_map
        if not runtime and not (m and m.entries):
            return None
        d = {"runtime": runtime, "perf_map": m.name if m else "",
             "entries": len(m.entries) if m else 0}
        if m and m.cut:
            d["cut"] = True
        return d

    def python_state(self) -> dict | None:
        """The interpreter found, and whether its frames were read (and if not, why)."""
        if self.python is None:
            return None
        d = self.python.describe()
        if self.python.layout is not None and self.segment is not None:
            d["allocators"] = bool(self.consumer.python_allocators_hooked())
            if d["frames"]:
                d["code_objects"] = len(self.python_code)
                d["unrecorded"] = int(self.consumer.python_unrecorded())
        return d

    def metadata(self) -> dict:
        from .. import __version__
        return {
            "pid": self.pid, "command": self.info.command, "exe": self.info.exe,
            "libc": self.libc,
            "host": socket.gethostname(), "memhook_version": __version__,
            "started_at": self.started_at, "ended_at": self.ended_at,
            # (a capture's checkpoints say how long it has traced so far: capture.py)
            "duration_s": round(self.ended_at - self.started_at, 3) if self.ended_at else 0.0,
            "end_reason": self.end_reason, "depth": self.options.depth,
            "abandoned": self.abandoned,
            "resident": self.resident,
            "heap_census": self.census,
            "leak_check": self.leaks,
            "mappings": self.mappings,
            "allocator_stats": self.allocator_stats,
            "vm_hwm_bytes": self.vm_hwm or procfs.peak_rss(self.pid),
            "embedded_suppressions": self.embedded_suppressions,
            "sample_rate": self.options.sample_rate,
            "min_size": self.options.min_size, "max_size": self.options.max_size,
            "slots_patched": len(self.patched), "slots_skipped": len(self.skipped),
            "slots_restored": self.restored, "pause_ms": self.pause_ms,
            "skipped_objects": self.skipped_objects,
            "allocators": [{"module": f.path, "family": f.family,
                            "functions": [allocators.shown(n) for n in f.names],
                            "not_hooked": [allocators.shown(n) for n in f.unhooked],
                            "traced": f.traced,
                            "entry_patched": [allocators.shown(n) for n in f.patched],
                            "refused": [{"function": allocators.shown(n), "why": w}
                                        for n, w in f.refused],
                            "note": f.line()} for f in self.allocators],
            "python": self.python_state(),
            "jit": self.jit_state(),
            "unwind": {"build_s": round(self.unwind.build_s, 3), "built": self.unwind.built,
                       "cached": self.unwind.cached,
                       "without_rows": self.unwind.without_rows(self.modules),
                       "derived": unwind_tables.derived(self.unwind.objects, self.modules)},
        }

