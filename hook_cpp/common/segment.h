// Layout of the shared-memory segment between the hook library (writer, inside the target) and
// the consumer (reader, inside memhook): one control block, then one ring per writer thread, then
// the rings' stack caches. (The address table below is the hooks' alone: it lives in the hook
// library.)
//
// Ordering across rings without a clock on the hot path. Events of one thread are in ring order.
// Events of different threads on the same pointer are ordered by the allocator itself (a block is
// freed before another thread gets it back), and the hooks record that order: the address table
// holds, per pointer, the ring and event number of its latest event; the next event on that
// pointer reads it (a dependency: "apply after ring R's event C") and writes its own. Plain loads
// and stores suffice: the allocator's own synchronisation orders a pointer's events, and each
// entry is one 8-byte word tagged with the pointer, so an entry overwritten by another pointer
// only loses a dependency, never forges one. Time comes from a TSC record every kTimeEveryBytes of a
// thread's records and from the consumer's own drain times.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "record_format.h"

namespace memhook {

constexpr uint64_t kMagic = 0x314b4f4f484d454dULL;  // "MEMHOOK1" little-endian
constexpr uint32_t kVersion = 24;
constexpr int kMaxHooks = 160;       // hook ids (hooks.def) are < kMaxHooks
constexpr int kMaxKnownObjects = 1024;
constexpr int kMaxLateSlots = 4096;
constexpr int kMaxSlots = 8192;
constexpr uint32_t kMaxRings = 254;   // ring numbers 1..254 fit a dependency's 8 bits
constexpr int kCallRegs = arch::kCallRegs;  // Control::call_regs: a thread's registers (NT_PRSTATUS)
constexpr int kTableBits = 22;        // address table: 4 Mi entries, 32 MiB (touched pages only)
constexpr uint64_t kTimeEveryBytes = 4096;  // ring bytes between a thread's TSC records
constexpr uint32_t kCheckEvery = 32;  // TSC records between a thread's heartbeat checks

enum Clock : uint32_t { kClockTsc = 0, kClockMonotonic = 1 };
// How the hooks choose what to record (the hook library's memhook_active). kEvery is 0 and no
// value is 1: the malloc hook compares the mode, with the session's generation, against a
// thread's (generation, recursion guard), so only "every call, guard clear" may compare equal.
enum Mode : int32_t { kEvery = 0, kSelective = 2 /* a size filter or sampling */, kOff = 3 };
// A slot's state: memhook plans it (kSlotPlanned), the hook library patches it or leaves it alone
// (kSlotSkipped, kSlotUnreadable), and restores it (kSlotRestored); a late slot whose library
// was unloaded is kSlotGone; a slot the dynamic loader bound over the hook (a lazy binding under
// way at attach) holds the real function at detach: kSlotRebound (hook_library/slots.h).
enum SlotState : uint32_t {
  kSlotEmpty = 0, kSlotPatched = 1, kSlotGone = 2, kSlotPlanned = 3, kSlotSkipped = 4,
  kSlotUnreadable = 5, kSlotRestored = 6, kSlotRebound = 7
};

// A GOT/data slot of a hooked function: planned by memhook (Control::slots) and patched by the
// hook library at attach, or found by the library itself in a library dlopen'ed after attach
// (Control::late). Detach restores both; so does the target itself if memhook dies.
struct PatchedSlot {
  uint64_t addr;
  uint64_t original;  // planned: the real function (0: unknown); then what the slot held
  uint64_t hook;
  uint32_t hook_id;
  uint16_t state;     // SlotState
  uint16_t readonly;  // in a RELRO page: writable only through mprotect
};
// An allocation function no slot reaches (linked into the executable), entry-patched: memhook
// plans it (entry_patch/: the bytes its jump replaces, the relocated trampoline for its cell)
// and the hook library writes it with every thread stopped (hook_library/entry_patches.h).
constexpr int kMaxEntries = 64;
constexpr int kMaxForked = 1024;  // children announced under --follow-fork, per session
constexpr uint64_t kForkWaitNs = 30ull * 1000000000u;  // the longest a child waits for memhook
// A cell: the stub to the hook (16 bytes), sampling sessions' inline sample entry (free's from
// kEntrySampler, malloc's just before the trampoline, into which it falls through), then from
// kEntryStub the trampoline.
constexpr int kEntryCell = 128, kEntryStub = 64, kEntrySampler = 16, kEntryOriginal = 32;
enum EntryState : uint16_t {
  kEntryEmpty = 0, kEntryPlanned = 1, kEntryPatched = 2, kEntryChanged = 3, kEntryRefused = 4,
  kEntryRestored = 5, kEntryKept = 6
};
struct EntryPatch {
  uint64_t addr;       // the function's entry
  uint64_t cell;       // its cell in the trampoline area: stub, then trampoline
  uint32_t hook_id;
  uint16_t length;     // bytes the jump replaces (whole instructions, >= 5)
  uint16_t state;      // EntryState; the GDB agent sets kEntryRefused (a thread inside)
  uint16_t trampoline_len;
  uint16_t pad[3];
  uint8_t original[kEntryOriginal];  // the function's first bytes, as planned
  uint8_t trampoline[kEntryCell - kEntryStub];
};
// Of a planned slot (Control::lazy): its object's PLT, where a slot not yet bound points.
struct LazyRange {
  uint64_t lo, hi;
};

// Allocator statistics: which reader, and how far it got.
enum StatsKind : uint32_t { kStatsNoReader = 0, kStatsJemalloc = 1, kStatsTcmalloc = 2,
                            kStatsMimalloc = 3 };
enum StatsState : uint32_t { kStatsIdle = 0, kStatsRunning = 1, kStatsDone = 2,
                             kStatsFailed = 3 };
constexpr int kStatsValues = 8;
constexpr uint64_t kStatsNone = ~uint64_t(0);

// A Python interpreter in the target (hook_library/python_frames.h): where CPython keeps a
// thread's frames and a code object's names, as memhook found them for the target's version
// (memhook/inject/python_layouts.py). Offsets are bytes; -1: the version has no such field.
enum InstrKind : uint32_t {
  kInstrLastiBytes = 0,  // int f_lasti, a byte offset (3.8, 3.9)
  kInstrLastiUnits = 1,  // int f_lasti, in 2-byte code units (3.10)
  kInstrPointer = 2      // a pointer into the code object's own instructions (3.11 on)
};
enum RunKind : uint32_t {
  kRunEachFrame = 0,  // every frame is a call of _PyEval_EvalFrameDefault (to 3.10)
  kRunFlag = 1,       // frame_is_entry marks the first frame of a call (3.11)
  kRunAfterShim = 2   // a call begins after a frame owned by the C stack (3.12 on)
};
constexpr uint32_t kPythonDepth = 64;  // Python frames a record carries at most
struct PythonLayout {
  uint64_t this_thread_state;  // PyGILState_GetThisThreadState; 0: no Python frames
  uint64_t code_type, unicode_type, bytes_type;  // &PyCode_Type, &PyUnicode_Type, &PyBytes_Type
  uint64_t type_type;  // &PyType_Type (the leak check's Python objects: interior_heuristics.h)
  uint32_t minor;  // the version: 3.minor
  uint32_t depth;  // Python frames a record carries at most
  int32_t tstate_frame;    // the thread state's frame, or its cframe (3.11, 3.12)
  int32_t cframe_current;  // the cframe's current frame; -1: tstate_frame is the frame
  int32_t frame_previous, frame_code, frame_instr, frame_owner, frame_is_entry;
  uint32_t instr_kind;  // InstrKind
  uint32_t run_kind;    // RunKind
  int32_t owner_generator, owner_cstack;
  int32_t code_name, code_filename, code_firstlineno, code_linetable, code_firsttraceable,
      code_units;
  int32_t code_consts;  // co_consts: in the line ob_type is in, a code object's fingerprint
  int32_t pad0;
  uint32_t str_length, str_state, str_ascii_data, str_compact_data;
  uint32_t bytes_size, bytes_data;
  // The allocator structs (PyMemAllocatorEx: ctx, malloc, calloc, realloc, free) PyMem_Malloc
  // and PyObject_Malloc call through; 0: not found (python_allocator.h). hooked: set by the
  // target once its hooks are in them.
  uint64_t mem_allocator, obj_allocator;
  uint32_t allocators_hooked;
  uint32_t pad;
};
// A code object's record in the code area (after the unwind area, Control::python_bytes long):
// the header, then the name, file name and line table, padded to 8 bytes. The hooks append
// them (Control::python_used, atomic) the first time a code object is seen; `bytes` is written
// last, so a reader stops at the first 0 and comes back later.
constexpr uint32_t kCodeTableCut = 1;  // flags: the line table was cut short
constexpr uint32_t kMaxCodeString = 4096, kMaxCodeTable = 1 << 18;
struct CodeRecord {
  uint32_t bytes;
  uint32_t flags;
  uint64_t code;  // the code object's address
  int32_t firstlineno;
  uint8_t name_kind, file_kind;  // bytes per character (1, 2, 4) as CPython keeps the string
  uint8_t minor, pad;
  uint32_t name_bytes, file_bytes, table_bytes, pad2;
};
static_assert(sizeof(CodeRecord) == 40, "a code record's header is 40 bytes");
// A ring's cache of the code objects its thread's frames ran (code_records.h): what the
// walk needs of each without reading it again. Valid while the epoch is the hooks' (a code
// object freed bumps it).
struct CodeCacheEntry {
  uint64_t code, epoch, consts;
  uint32_t record;
  int32_t firsttraceable;
};
constexpr uint32_t kCodeCacheEntries = 512;  // per ring; a power of two (python_import.py)
// A ring's Python area (hook_library/python_frames.h), touched only by a Python thread: its
// code cache, and the Python frames each recent stack was kept with (a recent stack repeats
// only with the same Python frames).
struct RingPython {
  CodeCacheEntry cache[kCodeCacheEntries];
  struct Frames {
    uint64_t n;
    uint64_t words[kPythonDepth];
  } recent[kRecentStacks];
};

struct alignas(64) Control {
  // Written by memhook before injection.
  uint64_t magic;
  uint32_t version;
  uint32_t control_bytes;  // sizeof(Control), checked by both sides
  uint32_t nrings;
  uint32_t ring_bytes;  // data bytes per ring, power of two
  uint32_t depth;       // max frames per backtrace
  uint32_t clock;       // Clock
  uint64_t min_size;    // size filter, inclusive
  uint64_t max_size;
  uint64_t sample_rate;  // 0: every call; else mean bytes between samples (Poisson per byte)
  uint64_t target_pid;
  uint64_t owner_pid;    // the memhook that made the segment, and its start time (clock ticks
  uint64_t owner_start;  // since boot, /proc/PID/stat): while it lives, it owns the target
  uint64_t real[kMaxHooks];  // address of each real function in the target, 0 if unknown
  uint32_t nknown;
  uint32_t no_avx512;  // 1: the malloc hook compares stacks with SSE4.1 even where AVX-512 runs
  uint64_t known_bases[kMaxKnownObjects];  // objects memhook handled (or skips) at attach
  uint64_t unwind_bytes;  // the unwind area's size (unwind_offset(); unwind_rows.h)

  // Futex word: a writer whose ring passes half full bumps it and wakes the consumer.
  alignas(64) uint32_t wake;
  uint32_t pad1;

  // The consumer's pulse (CLOCK_MONOTONIC ns). Older than abandon_after_ns: memhook is gone,
  // and the target unhooks itself.
  alignas(64) uint64_t heartbeat_ns;
  uint64_t abandon_after_ns;
  uint32_t abandoned;  // set by the target once it restored its slots
  uint32_t nslots;     // entries of `slots`: memhook's plan, patched by memhook_patch()
  PatchedSlot slots[kMaxSlots];

  // Written by the target.
  alignas(64) uint64_t lib_base;  // load bias of the hook library
  uint32_t started;
  uint32_t nlate;  // `late` entries in use
  uint32_t loads;  // libraries the target loaded since attach: memhook builds their unwind rows
  uint32_t loads_read;  // (memhook's) the `loads` it has read the maps for: exit_check.h
  uint64_t table;  // the address table in the target: memhook reads it at detach (reconcile)
  alignas(64) uint64_t dropped_no_ring;  // events lost because every ring was owned
  uint64_t dropped_frees_no_ring;        // of which frees
  alignas(64) PatchedSlot late[kMaxLateSlots];

  // Written by memhook before injection, beside `slots` (last, so that the fields the hooks
  // read keep their offsets).
  LazyRange lazy[kMaxSlots];
  // Entry patches (hook_library/entry_patches.h): the area for their cells, where memhook found
  // room within 2 GiB of every function, and the plan; states written back by the target.
  uint64_t entry_area;
  uint32_t entry_area_bytes;
  uint32_t nentries;
  EntryPatch entries[kMaxEntries];

  // An allocator's own statistics (hook_library/allocator_stats.h): memhook names the function
  // that reads them and its kind; a thread the hook library starts fills `stats` and the state.
  uint64_t stats_fn;
  uint32_t stats_kind;   // StatsKind
  uint32_t stats_state;  // StatsState
  uint64_t stats[kStatsValues];  // per kind (allocator_stats.h); kStatsNone where not given

  // --follow-fork (hook_library/lifecycle.h): memhook sets follow_forks; a child forked with
  // the hooks armed announces its PID in `forked` and waits, its hooks passing through, until
  // memhook has attached to it (or failed to) and cleared its entry, memhook's heartbeat stops,
  // or kForkWaitNs pass.
  uint32_t follow_forks;
  uint32_t nforked;  // entries of `forked` taken (beyond kMaxForked: not followed)
  int32_t forked[kMaxForked];
  // A thread about to exec (hook_library/following.h): its tid, and ExecState. memhook
  // becomes its tracer (PTRACE_O_TRACEEXEC) and says go; the new program is then held where its
  // loader is done, as memhook run holds a program it starts.
  int32_t exec_tid;
  uint32_t exec_state;

  // A full ring (hook_library/full_ring.h): the writer waits up to max_wait_ns for the
  // consumer to make room, then drops the event; 0: it drops at once. Without `lossless`, once
  // a wait runs out it drops without waiting until the consumer has emptied half the ring.
  uint64_t max_wait_ns;
  uint32_t lossless;
  // The leak check at exit (hook_library/exit_check.h): memhook sets check_at_exit; the thread
  // that runs the library's destructor in exit() sets exit_state to kExitAnnounced and waits
  // until memhook has taken the check (kExitDone), its heartbeat stops, or kForkWaitNs pass.
  uint32_t check_at_exit;
  uint32_t exit_state;
  uint32_t pad3;
  // A system call a stopped thread is made to make for the leak check (reachability/
  // forked_image.h, arch/*/syscall_stub.S): memhook writes here the registers the thread must
  // have after it (a system call it was interrupted in set to restart), and the stub puts them
  // back itself: a thread memhook leaves mid-way (killed) goes on as it would have. call_state:
  // CallState; memhook writes the registers only once the last thread has taken its own.
  uint64_t call_regs[kCallRegs];
  uint32_t call_state;
  // The copy of the process the check reads (its PID) until the process has reaped it: killed
  // with memhook, it is this process's zombie, which the hook library reaps (lifecycle.h).
  int32_t check_copy;
  // What the stub's last call returned, and which call it was (CallKind): a clone's copy is
  // named here by the stub itself, however early memhook is killed.
  int64_t call_result;
  uint32_t call_kind;
  uint32_t pad5;
  // A Python interpreter (python_frames.h): its layout, written by memhook before injection;
  // the code area's size, and what the hooks took of it and could not record.
  PythonLayout python;
  uint64_t python_bytes;
  uint64_t python_used;
  uint64_t python_unrecorded;  // code objects seen when the area was full
};
enum CallState : uint32_t { kCallFree = 0, kCallArmed = 1, kCallTaken = 2 };
enum CallKind : uint32_t { kCallNone = 0, kCallClone = 1, kCallWait = 2 };
enum ExitState : uint32_t { kExitNone = 0, kExitAnnounced = 1, kExitDone = 2 };
constexpr uint64_t kMaxWaitNs = 60000000000ull;  // --max-wait's bound: a minute per event

// kSpawnAnnounced: a thread about to start a program in a child (posix_spawn, system, popen:
// libc's own clone and exec, which no slot reaches); memhook traces the thread until the child
// is created (PTRACE_O_TRACEVFORK, TRACEFORK), then follows the child's exec.
enum ExecState : uint32_t {
  kExecNone = 0, kExecAnnounced = 1, kExecGo = 2, kExecFailed = 3, kSpawnAnnounced = 4
};

// Producer and consumer fields live on separate cache lines; only the owning thread writes the
// producer line, only the consumer writes `read`.
struct alignas(64) RingHeader {
  uint32_t owner;    // kernel tid of the writer, 0 = free
  uint32_t waiting;  // the writer sleeps on `read` (its low word): wake it when it moves
  uint64_t write;    // total bytes published (monotonic)
  uint64_t busy;     // nonzero while a hook holding this ring is running (detach waits for it)
  uint64_t dropped;  // events dropped because the ring was full
  uint64_t dropped_frees;  // of which frees (each may leave a freed block counted as live)
  uint64_t waits;          // --lossless: events that found the ring full and waited
  uint64_t wait_ns;        // the time they waited, in all
  uint32_t wait_timeouts;  // waits that reached Control::max_wait_ns (their events dropped)
  uint32_t wait_max_us;    // the longest wait
  alignas(64) uint64_t read;  // total bytes consumed (monotonic)
  uint8_t pad2[56];
};
static_assert(sizeof(RingHeader) == 128, "a ring header is two cache lines");

// Address table entry: dependency (40 bits) << kDepShift | live << 21 | tag (the pointer's bits
// above the index, 21 for a user-space pointer). The dependency sits where a header's does, so
// that an entry is a header once its low 24 bits are replaced. live: the pointer's latest event
// was an allocation (in sampling mode, a sampled one). The index is unique for a (tag, low bits)
// pair, so a tag match names the pointer.
constexpr uint64_t kTagMask = (uint64_t(1) << 21) - 1;
constexpr uint64_t kLive = uint64_t(1) << 21;
constexpr uint64_t table_entry(uint64_t tag, uint64_t live, uint64_t dep) {
  return dep << kDepShift | live | (tag & kTagMask);
}
constexpr uint32_t kGolden32 = 0x9E3779B9;  // 2^32 / golden ratio
struct TableIndex {
  uint64_t index, tag;
};
inline TableIndex table_index(uint64_t p) {
  uint64_t a = p >> 4;  // 16-byte granules: 43 bits of user address
  uint64_t tag = a >> kTableBits;
  // A multiplied tag moves each 64 MiB window to its own offset: glibc's thread arenas are
  // 64 MiB-aligned and fill alike, and plain folding would stack their blocks together. An odd
  // multiplier sends consecutive windows kGolden32 apart (mod the table), which spreads them;
  // the malloc hook multiplies by an immediate and loads nothing.
  return {(a ^ uint64_t(uint32_t(tag) * kGolden32)) & ((uint64_t(1) << kTableBits) - 1), tag};
}

// The writer's side of a ring's recent stacks, written and read by the hooks (memhook only
// empties them when it publishes new unwind rows: Consumer::forget_recent_stacks): the words
// each entry's walk read, so that an allocation from the same stack is recognised without
// walking. Key: the caller's rbp, the return address (ret0 0: an empty entry) and the stack
// pointer at the call (where the return address is): the walk's registers. A walk is a function
// of those and of the words it reads, whichever row read them (hook_library/unwinder.h): the same key
// and the same words now mean the same walk, and those loads do not depend on one another.
// Where no frame used the caller's rbp (code without frame pointers, where rbp holds data),
// `frame_used` is 0 and same_stack() lets rbp differ; the malloc hook's own comparison, which
// compares it first, then leaves the call to same_stack().
//
// `words` holds every word read, in order, for same_stack(). The malloc hook compares them in
// two unrolled sequences (malloc_entry.S) at fixed offsets from the entry: first the walk's
// leading frame-pointer frames as pairs (the frame's saved rbp, which is the next frame, and its
// return address: 16 bytes at the frame), n of them in pairs[kAlignedPairs - n, kAlignedPairs);
// then each remaining word by its address, m in steps[kAlignedSteps - m, kAlignedSteps). The
// word steps run first, when there are any, then the pairs.
constexpr uint32_t kAlignedPairs = 32;
constexpr uint32_t kAlignedSteps = 32;
constexpr uint32_t kWordsPerFrame = 3;  // a signal frame reads three (rbp, rsp, rip)
struct RecentStack {
  uint64_t frame, ret0, sp;
  uint64_t compare;        // where the malloc hook's comparison starts
  uint64_t pairs_compare;  // where its pairs start, after the word steps
  uint64_t size_bits;      // (1 + the entry) << kRecentShift: an allocation record's size word bits
  uint32_t nwords;         // words[0, nwords)
  uint32_t frame_used;     // did the walk use rbp as the caller had it?
  uint64_t pad[1];         // pairs start a cache line
  struct Pair {
    uint64_t next, ret;
  } pairs[kAlignedPairs];
  struct Word {
    uint64_t addr, value;
  } steps[kAlignedSteps];
  Word words[];  // kWordsPerFrame * depth
};
inline size_t recent_stack_stride(uint32_t depth) {
  return sizeof(RecentStack) + sizeof(RecentStack::Word) * kWordsPerFrame * size_t(depth);
}

inline size_t ring_stride(uint32_t ring_bytes) { return sizeof(RingHeader) + ring_bytes; }
inline size_t rings_offset() { return (sizeof(Control) + 4095) & ~size_t(4095); }
// The rings' stack caches, after the rings: kRecentStacks entries per ring.
inline size_t recent_stacks_offset(uint32_t nrings, uint32_t ring_bytes) {
  return rings_offset() + size_t(nrings) * ring_stride(ring_bytes);
}
// Each ring's Python area (RingPython), after the recent stacks.
inline size_t ring_python_offset(uint32_t nrings, uint32_t ring_bytes, uint32_t depth) {
  return recent_stacks_offset(nrings, ring_bytes) +
         size_t(nrings) * kRecentStacks * recent_stack_stride(depth);
}
inline size_t segment_bytes(uint32_t nrings, uint32_t ring_bytes, uint32_t depth) {
  return ring_python_offset(nrings, ring_bytes, depth) + size_t(nrings) * sizeof(RingPython);
}
// The unwind area (unwind_rows.h), after the recent stacks, Control::unwind_bytes long.
inline size_t unwind_offset(uint32_t nrings, uint32_t ring_bytes, uint32_t depth) {
  return (segment_bytes(nrings, ring_bytes, depth) + 4095) & ~size_t(4095);
}
// The code area (CodeRecord), after the unwind area, Control::python_bytes long.
inline size_t code_area_offset(const Control& c) {
  return unwind_offset(c.nrings, c.ring_bytes, c.depth) + c.unwind_bytes;
}
constexpr uint64_t kMaxCodeAreaBytes = uint64_t(1) << 30;

}  // namespace memhook
