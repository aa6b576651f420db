// The session as memhook_start set it up: the settings every hook reads, the session word
// (generation and mode) and the clock.
#pragma once

namespace {

// Session state, written by memhook_start while the target is stopped under GDB.
Control* g_ctl;
uint8_t* g_rings;
uint8_t* g_recent_stacks;  // kRecentStacks RecentStack entries per ring (segment.h)
uint32_t g_nrings, g_ring_bytes, g_depth, g_clock;
uint32_t g_record_frames;  // frames a record may carry: g_depth native, then Python ones
uint64_t g_min_size, g_max_size;
uint64_t g_sample_rate;  // 0: trace every call
bool g_selective;        // a size filter or sampling: allocations need a closer look
bool g_size_filter;      // --min-size / --max-size given
uintptr_t g_main_stack_lo, g_main_stack_hi;
uint32_t g_ring_populated[kMaxRings];  // the generation whose claim faulted each ring in
// Per ring: the recent stacks a walk kept since the ring was last claimed (a bit each), the
// only ones a claim must empty (frame_walk.h sets them; the segment starts zero).
uint32_t g_recent_kept[kMaxRings];
static_assert(kRecentStacks <= 32, "a bit per recent stack");

}  // namespace

namespace memhook {
// The session word, read by every hook: the session's generation (bumped on every attach: stale
// per-thread ring pointers re-claim) and the mode (segment.h), which memhook sets to kOff on
// detach (through GDB, as memhook_active) and a forked child sets itself. One 8-byte word, so
// that the malloc hook compares both with the thread's (generation, guard) in one load.
struct alignas(8) Session {
  uint32_t generation;
  volatile int32_t mode;
};
}  // namespace memhook

// Global (hidden), as the others malloc_entry.S reads.
uint32_t g_recent_stride asm("memhook_recent_stride");  // bytes per RecentStack entry
Session g_session asm("memhook_session") = {0, kOff};

asm(R"(
  .globl memhook_active
  .type memhook_active, @object
  .size memhook_active, 4
  .set memhook_active, memhook_session + 4
)");
// Where the control block is mapped in the target, for memhook's detach script.
extern "C" __attribute__((visibility("default"))) Control* volatile memhook_ctl;
Control* volatile memhook_ctl;

namespace {

inline int mode() { return __atomic_load_n(&g_session.mode, __ATOMIC_RELAXED); }
inline bool active() { return mode() != kOff; }

inline uint64_t monotonic_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + ts.tv_nsec;
}

inline uint64_t now() {
  if (__builtin_expect(g_clock == kClockTsc, 1)) return arch::cycles();
  return monotonic_ns();
}

}  // namespace
