// The library memhook injects into the target. GOT slots of allocation functions are pointed at
// the memhook_hook_* functions below; each calls the real function, then appends a Record to
// this thread's ring in the shared segment.
//
// Rules for everything reachable from a hook: never block, never allocate through a hooked
// path, never take a lock the target could hold, drop (and count) instead of waiting.
// TLS is initial-exec: a dlopen'ed library's dynamic TLS would be allocated with malloc on first
// touch, from inside the hook.
#include <cpuid.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include <algorithm>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "segment.h"

using namespace memhook;

extern "C" void* __libc_stack_end;  // top of the main thread's stack (exported by ld.so)
// Exceptions (std::bad_alloc) unwind through the operator-new hooks and must reset the
// recursion guard. The personality routine lives in libstdc++, which is loaded wherever
// operator new is; a weak reference keeps C targets free of libstdc++.
asm(".weak __gxx_personality_v0");

namespace {

enum HookId : int {
#define HOOK(id, sym, name, kind, ret, params, args) ID_##sym = id,
#include "hooks.def"
#undef HOOK
};

#define HOOK(id, sym, name, kind, ret, params, args) using real_##sym##_t = ret(*) params;
#include "hooks.def"
#undef HOOK

struct SymbolTable {
  const char* name[kMaxHooks] = {};
  SymbolTable() {
#define HOOK(id, sym, name_, kind, ret, params, args) name[id] = #sym;
#include "hooks.def"
#undef HOOK
  }
};
const SymbolTable kSymbols;
#define kSymbol kSymbols.name

// Session state, written by memhook_start while the target is stopped under GDB.
void* g_real[kMaxHooks] asm("memhook_g_real");
Control* g_ctl;
uint8_t* g_rings;
uint8_t* g_stack_caches;  // kStackSlots StackCache entries per ring (segment.h)
uint32_t g_stack_stride asm("memhook_g_stack_stride");  // bytes per entry
// The address table (segment.h): the hooks' own, so here rather than in the shared segment, where
// the malloc hook addresses it relative to its own code instead of loading a pointer. Pages are
// touched on demand; memhook_start empties it.
alignas(4096) uint64_t g_table[uint64_t(1) << kTableBits] asm("memhook_table");
uint32_t g_nrings, g_ring_bytes, g_depth, g_clock;
uint64_t g_min_size, g_max_size;
uint64_t g_sample_rate;  // 0: trace every call
bool g_selective;        // a size filter or sampling: allocations need a closer look
bool g_size_filter;      // --min-size / --max-size given
uintptr_t g_main_stack_lo, g_main_stack_hi;

struct ThreadState {
  // What every event touches, on one cache line.
  uint64_t write;        // the ring's write cursor (this thread is its only writer)
  uint64_t fast_until;   // writes ending at or before this cursor need no checks (reserve_slow)
  uint8_t* lap_base;     // lap_base + cursor: where the cursor lies in the ring (this lap)
  RingHeader* ring;
  uint64_t ring_no;      // the ring's number in dependencies (1..254)
  uintptr_t stack_lo, stack_hi;
  uint32_t generation;   // g_session.generation when `ring` was claimed
  uint32_t in_hook;  // recursion guard: the malloc inside operator new is not a second event
  uint8_t* stacks;   // the ring's stack caches
  uint64_t free_until;  // fast_until for frees, which may also use the ring's free headroom
  uint64_t alloc_until;  // memhook_hook_malloc's bound: a 24-byte record fits at w < alloc_until
  uint64_t entry_bias;   // + (w << 21): the table entry of a live block allocated at w (this lap)
  StackCache* last_slot;  // the slot of its latest allocation: the malloc hook looks there first
  // Slow paths only.
  uint8_t* data;         // the ring's data area
  uint64_t cached_read;  // last seen consumer cursor: refreshed only on reserve's slow path
  uint64_t woke_at;      // write cursor when this thread last woke the consumer
  uint64_t next_time;    // cursor from which the next event carries a clock reading first
  int64_t sample_left;   // sampling: bytes until this thread's next sample
  uint64_t rng;          // xorshift state for the sampling intervals
  uint32_t sample_generation;
  uint32_t tid;
  uint32_t until_check;  // clock readings until this thread next checks memhook's heartbeat
};
__thread ThreadState t_state asm("memhook_t_state") __attribute__((tls_model("initial-exec")));

void check_consumer();

// Sets the recursion guard for a hook's duration, also when operator new throws through it.
// Nested calls (operator new's malloc) leave the sampling countdown as it was: their bytes are
// this call's.
// Restores what it found: a guard inside a guard (operator new[] calls operator new through
// libstdc++'s hooked slot) must leave the outer one set.
struct Guard {
  ThreadState& t;
  int64_t left;
  uint32_t was;
  explicit Guard(ThreadState& s) : t(s), left(s.sample_left), was(s.in_hook) { t.in_hook = 1; }
  ~Guard() {
    t.sample_left = left;
    t.in_hook = was;
  }
};

#define REAL(sym) ((real_##sym##_t)g_real[ID_##sym])

// Operator new calls malloc through libstdc++'s own (hooked) slot.
struct Nests {
  bool id[kMaxHooks] = {};
  constexpr Nests() {
    for (int i : {ID__Znwm, ID__Znam, ID__ZnwmRKSt9nothrow_t, ID__ZnamRKSt9nothrow_t,
                  ID__ZnwmSt11align_val_t, ID__ZnamSt11align_val_t,
                  ID__ZnwmSt11align_val_tRKSt9nothrow_t, ID__ZnamSt11align_val_tRKSt9nothrow_t})
      id[i] = true;
  }
  constexpr bool operator[](int i) const { return id[i]; }
};
constexpr Nests kNests;

}  // namespace

// The session word, read by every hook: the session's generation (bumped on every attach: stale
// per-thread ring pointers re-claim) and the mode (segment.h), which memhook sets to kOff on
// detach (through GDB, as memhook_active) and a forked child sets itself. One 8-byte word, so
// that the malloc hook compares both with the thread's (generation, guard) in one load.
namespace {
struct alignas(8) Session {
  uint32_t generation;
  volatile int32_t mode;
};
Session g_session asm("memhook_session") = {0, kOff};
}  // namespace
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

inline uint64_t now() {
  if (__builtin_expect(g_clock == kClockTsc, 1)) return __rdtsc();
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + ts.tv_nsec;
}

void thread_stack_bounds(ThreadState& t) {
  if (t.tid == (uint32_t)g_ctl->target_pid) {
    t.stack_lo = g_main_stack_lo;
    t.stack_hi = g_main_stack_hi;
    return;
  }
  t.stack_lo = t.stack_hi = 0;
  pthread_attr_t attr;
  // Non-main threads: glibc reads the bounds from the thread descriptor (its affinity query may
  // realloc; that goes to the real allocator because the guard is set).
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    void* addr;
    size_t size;
    if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
      t.stack_lo = (uintptr_t)addr;
      t.stack_hi = (uintptr_t)addr + size;
    }
    pthread_attr_destroy(&attr);
  }
}

RingHeader* ring_at(uint32_t i) {
  return (RingHeader*)(g_rings + size_t(i) * ring_stride(g_ring_bytes));
}

// Stack slot `slot` of this thread's ring (StackCache, segment.h).
inline StackCache* stack_cache_at(ThreadState& t, uint32_t slot) {
  return (StackCache*)(t.stacks + slot * g_stack_stride);
}

bool try_take(RingHeader* r, uint32_t expected, uint32_t tid) {
  return __atomic_compare_exchange_n(&r->owner, &expected, tid, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED);
}

// The consumer sleeps on a futex between drains; a filling ring cuts its sleep short. Rare
// (once per quarter ring) and FUTEX_WAKE never blocks.
__attribute__((noinline)) void wake_consumer(ThreadState& t, uint64_t w) {
  t.woke_at = w;
  __atomic_fetch_add(&g_ctl->wake, 1, __ATOMIC_RELEASE);
  syscall(SYS_futex, &g_ctl->wake, FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

// The last eighth of a ring is for frees. Under overload allocations are dropped first: a lost
// allocation only leaves a block unreported (its free is then an unknown free), where a lost
// free would leave a freed block reported as outstanding, a leak that is not there.
inline uint64_t free_headroom(uint64_t cap) { return cap / 8; }

// Slow path of reserve(): wrap to the ring's start (a padding record), look at the consumer's
// cursor, wake it when the ring passes half full, write a clock reading when one is due (every
// kTimeEveryBytes of records, and before a thread's first event). Returns the write cursor, or
// UINT64_MAX when the ring is full for this kind of event (the caller drops it).
__attribute__((noinline)) uint64_t reserve_slow(ThreadState& t, size_t bytes, bool is_free) {
  const uint64_t cap = g_ring_bytes, headroom = free_headroom(cap);
  uint64_t w = t.write;
  const bool timed = w + bytes > t.next_time;
  const size_t need = bytes + (timed ? 16 : 0);
  uint64_t pos = w & (cap - 1);
  uint64_t pad = (pos + need > cap) ? cap - pos : 0;
  t.cached_read = __atomic_load_n(&t.ring->read, __ATOMIC_ACQUIRE);
  uint64_t used = w + pad + need - t.cached_read;
  if (used > cap / 2 && w - t.woke_at > cap / 4) wake_consumer(t, w);
  if (used > (is_free ? cap : cap - headroom)) return UINT64_MAX;
  if (pad) {
    *(uint64_t*)(t.data + pos) = header(kPadding, 0, 0, 0);
    w += pad;
  }
  t.lap_base = t.data - (w & ~(cap - 1));
  if (timed) {
    uint64_t* at = (uint64_t*)(t.lap_base + w);
    at[0] = header(kTime, 0, 0, 0);
    at[1] = now();
    w += 16;
    t.next_time = w + kTimeEveryBytes;
    if (--t.until_check == 0) {
      t.until_check = kCheckEvery;
      check_consumer();
    }
  }
  t.write = w;  // published with the event
  // Look again at the lap's end, when a clock reading is due, when the ring passes half full
  // (to wake the consumer) and when it is full for this kind of event as last seen: never per
  // event while the ring is merely more than half full, since the consumer's cursor lives on a
  // line it keeps writing.
  const uint64_t half = t.cached_read + cap / 2, until = std::min((w | (cap - 1)) + 1, t.next_time);
  t.fast_until = std::min(until, w < half ? half : t.cached_read + cap - headroom);
  t.free_until = std::min(until, w < half ? half : t.cached_read + cap);
  t.alloc_until = t.fast_until > 23 ? t.fast_until - 23 : 0;
  // Exact for every cursor of this lap: a lap never crosses a multiple of 2^35, where the
  // entry's 32-bit event number would wrap.
  t.entry_bias = table_entry(0, kLive, event_name(t.ring_no, w)) - (w << 21);
  return w;
}

// Writes ending at or before this cursor need no checks (frees may use the free headroom).
inline uint64_t room_until(const ThreadState& t, bool is_free) {
  return is_free ? t.free_until : t.fast_until;
}

// Where `bytes` contiguous bytes may be written (*w); false: the ring is full for this kind of
// event, drop it.
inline bool reserve(ThreadState& t, size_t bytes, uint64_t* w, bool is_free = false) {
  *w = t.write;
  if (__builtin_expect(*w + bytes <= room_until(t, is_free), 1)) return true;
  *w = reserve_slow(t, bytes, is_free);
  return *w != UINT64_MAX;
}

// Valid for a cursor reserve() returned.
inline uint64_t* slot_at(ThreadState& t, uint64_t w) { return (uint64_t*)(t.lap_base + w); }

inline void publish(ThreadState& t, uint64_t end) {
  t.write = end;
  __atomic_store_n(&t.ring->write, end, __ATOMIC_RELEASE);
}

// A record that is not an event (time, thread): published on its own.
void write_marker(ThreadState& t, uint64_t head, uint64_t value, size_t words) {
  uint64_t w;
  if (!reserve(t, 8 * words, &w)) return;
  uint64_t* at = slot_at(t, w);
  at[0] = head;
  if (words > 1) at[1] = value;
  publish(t, w + 8 * words);
}

// Slow path, once per thread per attach: own a ring. A ring whose owner thread has exited is
// taken over; its cursors carry on, so nothing already written is lost.
__attribute__((noinline)) RingHeader* claim_ring(ThreadState& t) {
  t.ring = nullptr;
  t.generation = 0;
  t.tid = (uint32_t)syscall(SYS_gettid);
  // pthread_getattr_np holds the thread's own lock around its reallocs: they must pass through.
  uint32_t was = t.in_hook;
  t.in_hook = 1;
  thread_stack_bounds(t);
  t.in_hook = was;
  RingHeader* got = nullptr;
  uint32_t no = 0;
  for (uint32_t i = 0; i < g_nrings && !got; i++) {
    RingHeader* r = ring_at(i);
    uint32_t owner = __atomic_load_n(&r->owner, __ATOMIC_RELAXED);
    if ((owner == 0 || owner == t.tid) && try_take(r, owner, t.tid)) got = r, no = i + 1;
  }
  for (uint32_t i = 0; i < g_nrings && !got; i++) {
    RingHeader* r = ring_at(i);
    uint32_t owner = __atomic_load_n(&r->owner, __ATOMIC_RELAXED);
    if (syscall(SYS_tgkill, (pid_t)g_ctl->target_pid, (pid_t)owner, 0) != 0 && errno == ESRCH &&
        try_take(r, owner, t.tid))
      got = r, no = i + 1;
  }
  if (got) {
    // Fault the ring in now, once, rather than a page at a time inside later hooks.
    // madvise wants a page-aligned start; rings are not (each has a 128-byte header).
    const uintptr_t lo = (uintptr_t)got & ~uintptr_t(4095);
    madvise((void*)lo, (uintptr_t)got + ring_stride(g_ring_bytes) - lo, MADV_POPULATE_WRITE);
    t.ring = got;
    t.data = (uint8_t*)(got + 1);
    // The slots' stacks were another thread's (or none): forget them. The consumer learns a
    // slot's stack from the record that fills it, in this ring's order.
    t.stacks = g_stack_caches + size_t(no - 1) * kStackSlots * g_stack_stride;
    for (uint32_t s = 0; s < kStackSlots; s++) stack_cache_at(t, s)->ret0 = 0;  // no call site
    t.last_slot = stack_cache_at(t, 0);
    t.write = got->write;
    t.cached_read = __atomic_load_n(&got->read, __ATOMIC_ACQUIRE);
    t.fast_until = t.free_until = t.alloc_until = 0;  // the first reserve takes the slow path
    t.woke_at = t.write;
    t.ring_no = no;
    t.next_time = t.write;  // the first event carries a clock reading
    t.until_check = kCheckEvery;
    t.generation = g_session.generation;  // only a claimed ring makes the fast path valid
    write_marker(t, header(kThread, 0, 0, t.tid), 0, 1);
  }
  return got;
}

inline void count_no_ring(bool is_free = false) {
  __atomic_fetch_add(&g_ctl->dropped_no_ring, 1, __ATOMIC_RELAXED);
  if (is_free) __atomic_fetch_add(&g_ctl->dropped_frees_no_ring, 1, __ATOMIC_RELAXED);
}

inline bool size_wanted(uint64_t size) { return size >= g_min_size && size <= g_max_size; }

// ---- Sampling: a Poisson process over allocated bytes, per thread. ----

// ln(x) for x in (0, 1], to ~1e-10: the hook library does not pull in libm.
double log_unit(double x) {
  uint64_t bits;  // x = m * 2^e, m in [0.5, 1); x is normal here
  memcpy(&bits, &x, 8);
  int e = int((bits >> 52) & 0x7ff) - 1022;
  bits = (bits & ~(uint64_t(0x7ff) << 52)) | (uint64_t(1022) << 52);
  double m;
  memcpy(&m, &bits, 8);
  if (m < 0.70710678118654752) {
    m *= 2;
    e--;
  }
  double s = (m - 1) / (m + 1), s2 = s * s;
  double series = s * (2 + s2 * (2.0 / 3 + s2 * (2.0 / 5 + s2 * (2.0 / 7 + s2 * (2.0 / 9 +
                  s2 * (2.0 / 11 + s2 * (2.0 / 13)))))));
  return series + e * 0.69314718055994531;
}

// Bytes until the next sample: exponential with mean g_sample_rate.
__attribute__((noinline)) int64_t next_sample_interval(ThreadState& t) {
  if (t.sample_generation != g_session.generation) {
    t.sample_generation = g_session.generation;
    t.rng = (uint64_t)syscall(SYS_gettid) * 0x9E3779B97F4A7C15ull ^ __rdtsc();
  }
  uint64_t x = t.rng ? t.rng : 0x2545F4914F6CDD1Dull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  t.rng = x;
  double u = double((x * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;  // [0, 1)
  return (int64_t)(-log_unit(1.0 - u) * double(g_sample_rate)) + 1;
}

// Is this call of `size` bytes recorded, its countdown having reached zero (sampling: with
// probability 1 - exp(-size/rate); the countdown is exponential, so memoryless), then a fresh
// interval. A countdown left from an earlier session is kept: drawn with that session's rate,
// and exact when the rate is unchanged.
__attribute__((noinline)) bool chosen_slow(ThreadState& t, uint64_t size) {
  if (!g_sample_rate) return !g_size_filter || size_wanted(size);
  if (t.sample_generation != g_session.generation) {  // this thread's first look in this session
    t.sample_left = next_sample_interval(t) - (int64_t)size;
    if (t.sample_left > 0) return false;
  }
  t.sample_left = next_sample_interval(t);
  return !g_size_filter || size_wanted(size);
}

// Sampling's common case: subtract `size` from the countdown; true while bytes remain. One
// read-modify-write instruction whose flags answer (a signed "greater": the same as the
// subtraction's result > 0 for any countdown and size below 2^62).
inline bool count_down(ThreadState& t, uint64_t size) {
  bool left;
  asm("subq %2, %0" : "+m"(t.sample_left), "=@ccg"(left) : "er"(size) : "cc");
  return left;
}

// The same decision for reallocs, countdown included.
inline bool chosen(ThreadState& t, uint64_t size) {
  if (g_sample_rate && __builtin_expect(count_down(t, size), 1)) return false;
  return chosen_slow(t, size);
}

// ---- Recording. ----

// This event, starting at cursor w, becomes the pointer's latest in the address table. Returns
// the dependency on the previous one (0 if the entry belonged to another pointer; one on this
// thread's own ring is trivially met, the consumer applies a ring in order).
inline uint64_t table_swap(ThreadState& t, uint64_t p, uint64_t live, uint64_t w) {
  TableIndex ti = table_index(p);
  uint64_t* e = g_table + ti.index;
  uint64_t old = __atomic_load_n(e, __ATOMIC_RELAXED);
  __atomic_store_n(e, table_entry(ti.tag, live, event_name(t.ring_no, w)), __ATOMIC_RELAXED);
  return (old & kTagMask) == (ti.tag & kTagMask) ? old >> kDepShift : 0;
}

// Sampling mode: a counting filter of the sampled blocks still live, so that the free of a block
// that was not sampled (nearly every free) reads one byte of a 4 KiB array the core keeps close,
// not the pointer's entry in the 32 MiB address table (an entry far from anything else the free
// touches: malloc/free loops ran 1.2-1.5x slower for that one load). A counter is raised when a
// block is sampled and lowered when its free is recorded; zero: no sampled block lives there.
// Lost table entries only leave counters raised (the table is still asked); 255 sticks.
alignas(64) uint8_t g_sampled[4096];

inline uint8_t* sampled_counter(uint64_t p) { return &g_sampled[((p ^ p >> 12) >> 4) & 4095]; }

// delta +1: `p` was sampled; -1: its free is recorded. Rare (once per sample): a CAS loop.
__attribute__((noinline)) void count_sampled(uint64_t p, int delta) {
  uint8_t* c = sampled_counter(p);
  uint8_t v = __atomic_load_n(c, __ATOMIC_RELAXED);
  while (v != 255 && (delta > 0 || v != 0) &&
         !__atomic_compare_exchange_n(c, &v, uint8_t(v + delta), true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
}

// Sampling mode: is `p` a sampled block still live? The filter says no for nearly every block;
// the address table answers for the rest.
inline bool sampled_live(uint64_t p) {
  if (!__atomic_load_n(sampled_counter(p), __ATOMIC_RELAXED)) return false;
  TableIndex ti = table_index(p);
  uint64_t e = __atomic_load_n(g_table + ti.index, __ATOMIC_RELAXED);
  return (e & kTagMask) == (ti.tag & kTagMask) && (e & kLive);
}

// A pointer word: the pointer, and in its top bits how far `frame` lies below the top of this
// thread's stack (in 16-byte units; 0: unknown, as for a frame of 0 or off the stack), which is
// all the consumer compares frames by.
inline uint64_t with_depth(ThreadState& t, uint64_t ptr, uint64_t frame) {
  uint64_t depth = (t.stack_hi - frame) >> 4;
  return (ptr & kPtrMask) | (depth < (uint64_t(1) << (64 - kPtrBits)) ? depth << kPtrBits : 0);
}

// Where a hook was called from: the stack slot holding its return address (the allocation's
// call site) and the caller's frame pointer. A compiled hook finds both in its own frame; the
// assembly entry (memhook_hook_malloc) has none and passes them as it found them.
struct Origin {
  void** ret;
  void** frame;
};
inline Origin origin_of(void** fp) { return {fp + 1, (void**)fp[0]}; }

// ---- The ring's stack slots (StackCache, segment.h). ----

// The slot a call from `from` uses: its return address and stack pointer pick it, so that a
// wrapper (one call site, many stacks) called from different depths uses different slots.
inline StackCache* stack_slot(ThreadState& t, uint64_t ret0, Origin from, uint32_t* slot) {
  constexpr int bits = __builtin_ctz(kStackSlots);
  *slot = uint32_t(uint32_t(ret0 ^ (uint64_t)from.ret) * kGolden32) >> (32 - bits);
  return stack_cache_at(t, *slot);
}

// Would backtrace() from `from` yield the stack `c` holds? The same key, then the 2n words that
// walk read, compared 16 bytes at a time at the addresses the slot recorded: no load waits for
// another, where the walk follows a chain. Every address read lies between the caller's frame
// and the top of this thread's stack (the walk that filled the slot checked them, on this
// thread: claim_ring empties the slots), so nothing read can fault.
inline bool same_stack(const StackCache* c, Origin from, uint64_t ret0) {
  if (c->frame != (uint64_t)from.frame || c->ret0 != ret0)
    return false;
  __m128i diff = _mm_setzero_si128();
  const void* f = from.frame;
  for (uint32_t i = c->first; i < c->first + c->n; i++) {
    const __m128i want = _mm_load_si128((const __m128i*)&c->pairs[i]);
    diff = _mm_or_si128(diff, _mm_xor_si128(_mm_loadu_si128((const __m128i*)f), want));
    f = (const void*)c->pairs[i].next;
  }
  return _mm_movemask_epi8(_mm_cmpeq_epi8(diff, _mm_setzero_si128())) == 0xffff;
}

// memhook_hook_malloc compares a slot's pairs in an unrolled sequence of kAlignedPairs steps,
// step j comparing pairs[j] (StackCache): a slot of n pairs enters it at step kAlignedPairs - n
// (n above: the miss). Two such sequences: with AVX-512 (vpternlogq) or SSE4.1.
// Every step but the last, which follows no pointer, has the same size.
extern "C" const char memhook_compare_sse[], memhook_compare_sse_last[], memhook_compare_avx512[],
    memhook_compare_avx512_last[], memhook_compare_miss[];
const char* g_compare_first;  // the sequence this CPU runs (memhook_start)
const char* g_compare_last;
inline uint64_t compare_entry(uint32_t n) {
  if (n > kAlignedPairs) return (uint64_t)memhook_compare_miss;
  const uint64_t step = (g_compare_last - g_compare_first) / (kAlignedPairs - 1);
  return (uint64_t)g_compare_first + (kAlignedPairs - n) * step;
}

// Frame-pointer walk from the call site (ret0, the return address in from.ret). Each frame
// pointer followed must lie above the previous one (the first above the return-address slot)
// and below the top of this thread's stack, so every read stays on the stack between the hook
// and its top: code built without frame pointers ends the walk (or adds a bogus address), never
// faults. A hook off the thread's stack (a signal stack) yields the call site alone. Returns the
// frames written to `out`; *caller: the allocating function's frame base, or 0. A walk that
// could be made is kept in slot `c`.
inline uint32_t backtrace(ThreadState& t, Origin from, uint64_t ret0, uint64_t* out,
                          uint64_t* caller, StackCache* c) {
  uint64_t* o = out;
  uint64_t* const end = out + g_depth;
  *o++ = ret0;
  *caller = 0;
  const uintptr_t lo = t.stack_lo, hi = t.stack_hi, top = hi - 16;
  void** f = from.frame;
  if ((uintptr_t)from.ret - lo < hi - lo && (uintptr_t)f > (uintptr_t)from.ret &&
      (uintptr_t)f <= top) {
    *caller = (uint64_t)f;
    StackCache::Pair* pr = c->pairs;
    while (o < end) {
      const uint64_t next = (uint64_t)f[0], ret = (uint64_t)f[1];
      *o++ = ret;
      *pr++ = {next, ret};
      if (next <= (uintptr_t)f || next > top) break;
      f = (void**)next;
    }
    const uint32_t n = uint32_t(pr - c->pairs);
    c->first = n <= kAlignedPairs ? kAlignedPairs - n : 0;
    if (c->first) memmove(c->pairs + c->first, c->pairs, n * sizeof(StackCache::Pair));
    c->n = n;
    c->frame = (uint64_t)from.frame;
    c->ret0 = ret0;
    c->compare = compare_entry(n);
  }
  return uint32_t(o - out);
}

// An allocation record's pointer word, size word and frames (none when a slot holds the stack).
struct StackWords {
  uint64_t ptr, size;
  uint32_t nframes;
};
__attribute__((always_inline)) inline StackWords stack_words(ThreadState& t, Origin from,
                                                             uint64_t p, uint64_t size,
                                                             uint64_t* frames) {
  const uint64_t ret0 = (uint64_t)*from.ret;
  uint32_t slot;
  StackCache* c = stack_slot(t, ret0, from, &slot);
  t.last_slot = c;  // the slot of a stack just seen or just walked
  size &= kSizeMask;
  if (same_stack(c, from, ret0))  // the slot's stack again: no frames
    return {p & kPtrMask, size | c->slot_word, 0};  // its depth is the slot's (segment.h)
  uint64_t caller;
  const uint32_t n = backtrace(t, from, ret0, frames, &caller, c);
  if (!caller) return {with_depth(t, p, 0), size, n};
  c->slot_word = uint64_t(slot + 1) << kSlotShift;
  return {with_depth(t, p, caller), size | c->slot_word, n};
}

inline void end_busy(RingHeader* r) { __atomic_store_n(&r->busy, 0, __ATOMIC_RELEASE); }

inline void drop(RingHeader* r) { __atomic_store_n(&r->dropped, r->dropped + 1, __ATOMIC_RELAXED); }
inline void drop_free(RingHeader* r) {
  drop(r);
  __atomic_store_n(&r->dropped_frees, r->dropped_frees + 1, __ATOMIC_RELAXED);
}

// This thread's ring, claimed on its first event of a session; false: the event is lost (and
// counted).
inline bool event_ring(ThreadState& t, bool is_free = false) {
  if (__builtin_expect(t.generation != g_session.generation, 0) && !claim_ring(t)) {
    count_no_ring(is_free);
    return false;
  }
  return true;
}

// Signal handlers may allocate: the recursion guard must be set before a record's cursor is
// read and cleared only after it is published, in that order as a handler sees it.
inline void enter(ThreadState& t) {
  t.in_hook = 1;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}
inline void leave(ThreadState& t) {
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  t.in_hook = 0;
}

// The common case: this thread's ring is claimed for this session and `bytes` fit at cursor w
// without a look at the consumer, a wrap or a clock reading (reserve_slow sets fast_until and
// free_until).
inline bool fast_room(ThreadState& t, uint64_t w, size_t bytes, bool is_free = false) {
  return __builtin_expect(
      t.generation == g_session.generation && w + bytes <= room_until(t, is_free), 1);
}

// The record of an allocation that returned `p`, at `at` (cursor w). Returns its words.
__attribute__((always_inline)) inline size_t write_alloc(ThreadState& t, uint64_t* at,
                                                         uint64_t w, int op, void* p,
                                                         uint64_t size, Origin from) {
  const uint64_t dep = table_swap(t, (uint64_t)p, kLive, w);
  const StackWords s = stack_words(t, from, (uint64_t)p, size, at + 3);
  at[1] = s.ptr;
  at[2] = s.size;
  at[0] = header(kAlloc, op, s.nframes, dep);
  return 3 + s.nframes;
}

__attribute__((noinline)) void record_alloc_slow(ThreadState& t, int op, void* p, uint64_t size,
                                                 Origin from) {
  uint64_t w;
  if (!event_ring(t)) return;
  if (!reserve(t, 8 * (3 + g_depth), &w)) return drop(t.ring);
  publish(t, w + 8 * write_alloc(t, slot_at(t, w), w, op, p, size, from));
}

// An allocation that returned `p`, recorded after the real call (the guard set).
__attribute__((always_inline)) inline void record_alloc(ThreadState& t, int op, void* p,
                                                        uint64_t size, Origin from) {
  const uint64_t w = t.write;
  if (!fast_room(t, w, 8 * (3 + g_depth))) return record_alloc_slow(t, op, p, size, from);
  publish(t, w + 8 * write_alloc(t, slot_at(t, w), w, op, p, size, from));
}

__attribute__((noinline)) void* record_alloc_slow_leave(ThreadState& t, int op, void* p,
                                                        uint64_t size, Origin from) {
  record_alloc_slow(t, op, p, size, from);
  leave(t);
  return p;
}

// Full tracing's record of an allocation: out of line, so that the hook around the real call
// keeps few registers, and a leaf on its common path (the slow path a tail call), so that it
// saves few itself (two, where the record inlined into the hook made it save six). Sets and
// clears the guard. Returns `p`, so that an entry can tail-call it.
template <int Op>
__attribute__((always_inline)) inline void* record_alloc_leaf(void* p, uint64_t size,
                                                             Origin from) {
  ThreadState& t = t_state;
  enter(t);
  const uint64_t w = t.write;
  if (!fast_room(t, w, 8 * (3 + g_depth))) return record_alloc_slow_leave(t, Op, p, size, from);
  publish(t, w + 8 * write_alloc(t, slot_at(t, w), w, Op, p, size, from));
  leave(t);
  return p;
}

template <int Op>
__attribute__((noinline, optimize("omit-frame-pointer"))) void record_alloc_now(void* p,
                                                                               uint64_t size,
                                                                               Origin from) {
  record_alloc_leaf<Op>(p, size, from);
}

inline void write_free(ThreadState& t, uint64_t* at, uint64_t w, int op, void* p, void** fp) {
  at[0] = header(kFree, op, 0, table_swap(t, (uint64_t)p, 0, w));
  at[1] = with_depth(t, (uint64_t)p, (uint64_t)fp);
}

__attribute__((noinline)) void record_free_slow(ThreadState& t, int op, void* p, void** fp) {
  uint64_t w;
  if (!event_ring(t, true)) return;
  if (!reserve(t, 16, &w, true)) return drop_free(t.ring);
  write_free(t, slot_at(t, w), w, op, p, fp);
  publish(t, w + 16);
}

// A free, recorded (and published) before the real call (the guard set): once it returns,
// another thread may get the block back, and that thread's event will depend on this one.
__attribute__((always_inline)) inline void record_free(ThreadState& t, int op, void* p,
                                                       void** fp) {
  const uint64_t w = t.write;
  if (!fast_room(t, w, 16, true)) return record_free_slow(t, op, p, fp);
  write_free(t, slot_at(t, w), w, op, p, fp);
  publish(t, w + 16);
}

inline uint64_t page_round(uint64_t n) { return (n + 4095) & ~uint64_t(4095); }

// ---- Libraries loaded after attach: the target patches their slots itself. ----

struct Known {
  uintptr_t base, lo, hi;  // load bias and mapped address range
};
Known g_known[kMaxKnownObjects];
uint32_t g_nknown;
int g_scan_lock;  // only the dlopen/dlclose hooks take it, never an allocation hook

void* g_hook_fn[kMaxHooks];

bool known(uintptr_t base) {
  for (uint32_t i = 0; i < g_nknown; i++)
    if (g_known[i].base == base) return true;
  return false;
}

int hook_id_of(const char* name) {
  for (int id = 1; id < kMaxHooks; id++)
    if (kSymbol[id] && g_hook_fn[id] && strcmp(kSymbol[id], name) == 0) return id;
  return 0;
}

void note_late_slot(uint64_t addr, uint64_t original, uint64_t hook, int id, bool readonly) {
  uint32_t i = __atomic_load_n(&g_ctl->nlate, __ATOMIC_RELAXED);
  if (i >= (uint32_t)kMaxLateSlots) return;
  PatchedSlot& s = g_ctl->late[i];
  s.addr = addr;
  s.original = original;
  s.hook = hook;
  s.hook_id = (uint32_t)id;
  s.readonly = readonly;
  __atomic_store_n(&s.state, (uint16_t)kSlotPatched, __ATOMIC_RELEASE);
  __atomic_store_n(&g_ctl->nlate, i + 1, __ATOMIC_RELEASE);
}

// One 8-byte store into a slot, through mprotect when the slot's page is read-only (RELRO).
bool write_slot(uint64_t* slot, uint64_t value, bool readonly) {
  uintptr_t page = (uintptr_t)slot & ~uintptr_t(4095);
  if (readonly && mprotect((void*)page, 4096, PROT_READ | PROT_WRITE) != 0) return false;
  __atomic_store_n(slot, value, __ATOMIC_RELEASE);
  if (readonly) mprotect((void*)page, 4096, PROT_READ);
  return true;
}

// What the dynamic linker would bind `symbol` to for this object. These calls go through the
// hook library's own (never patched) slots.
void* resolve_in_scope(const char* object, const char* symbol) {
  void* h = dlopen(object && object[0] ? object : nullptr, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return nullptr;
  void* f = dlsym(h, symbol);
  dlclose(h);
  return f;
}

// Patch one object's slots from its dynamic section, the same relocations memhook resolves
// with pyelftools at attach: JUMP_SLOT, GLOB_DAT and R_X86_64_64 against a hooked symbol.
void patch_object(const struct dl_phdr_info* info, uintptr_t lo, uintptr_t hi) {
  const uintptr_t base = info->dlpi_addr;
  const ElfW(Dyn)* dyn = nullptr;
  uintptr_t relro_lo = 0, relro_hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn)*)(base + ph.p_vaddr);
    if (ph.p_type == PT_GNU_RELRO) {
      relro_lo = (base + ph.p_vaddr) & ~uintptr_t(4095);
      relro_hi = (base + ph.p_vaddr + ph.p_memsz) & ~uintptr_t(4095);
    }
  }
  if (!dyn) return;
  // ld.so relocates these in place for most objects; an unrelocated one is an offset.
  auto addr = [&](uintptr_t v) { return v < base ? v + base : v; };
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Rela)*rela = nullptr, *jmprel = nullptr;
  size_t relasz = 0, pltrelsz = 0;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; d++) {
    switch (d->d_tag) {
      case DT_SYMTAB: symtab = (const ElfW(Sym)*)addr(d->d_un.d_ptr); break;
      case DT_STRTAB: strtab = (const char*)addr(d->d_un.d_ptr); break;
      case DT_RELA: rela = (const ElfW(Rela)*)addr(d->d_un.d_ptr); break;
      case DT_RELASZ: relasz = d->d_un.d_val; break;
      case DT_JMPREL: jmprel = (const ElfW(Rela)*)addr(d->d_un.d_ptr); break;
      case DT_PLTRELSZ: pltrelsz = d->d_un.d_val; break;
    }
  }
  if (!symtab || !strtab) return;
  const ElfW(Rela)* tables[2] = {rela, jmprel};
  const size_t counts[2] = {relasz / sizeof(ElfW(Rela)), pltrelsz / sizeof(ElfW(Rela))};
  for (int k = 0; k < 2; k++) {
    for (size_t i = 0; tables[k] && i < counts[k]; i++) {
      const ElfW(Rela)& r = tables[k][i];
      uint32_t type = ELF64_R_TYPE(r.r_info);
      if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT && type != R_X86_64_64)
        continue;
      if (type == R_X86_64_64 && r.r_addend != 0) continue;
      const ElfW(Sym)& s = symtab[ELF64_R_SYM(r.r_info)];
      int id = hook_id_of(strtab + s.st_name);
      if (!id) continue;
      uint64_t* slot = (uint64_t*)(base + r.r_offset);
      uint64_t cur = __atomic_load_n(slot, __ATOMIC_RELAXED);
      uint64_t hook = (uint64_t)g_hook_fn[id];
      if (cur == hook) continue;
      if (!g_real[id]) {
        // First sight of this function (say libstdc++ arrived with the library): a bound slot
        // holds the real address; a lazy one is resolved in the object's own lookup scope.
        void* found = (cur >= lo && cur < hi) ? resolve_in_scope(info->dlpi_name, kSymbol[id])
                                              : (void*)cur;
        void* expected = nullptr;
        if (found)
          __atomic_compare_exchange_n(&g_real[id], &expected, found, false, __ATOMIC_RELEASE,
                                      __ATOMIC_RELAXED);
      }
      // Only a slot still holding the real function or a lazy PLT target in this object.
      if (!g_real[id] || !(cur == (uint64_t)g_real[id] || (cur >= lo && cur < hi))) continue;
      uintptr_t page = (uintptr_t)slot & ~uintptr_t(4095);
      bool ro = page >= relro_lo && page < relro_hi;
      if (!write_slot(slot, hook, ro)) continue;
      note_late_slot((uint64_t)slot, cur, hook, id, ro);
    }
  }
}

int scan_object(struct dl_phdr_info* info, size_t, void*) {
  if (known(info->dlpi_addr) || g_nknown >= (uint32_t)kMaxKnownObjects) return 0;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    if (info->dlpi_addr + ph.p_vaddr < lo) lo = info->dlpi_addr + ph.p_vaddr;
    if (info->dlpi_addr + ph.p_vaddr + ph.p_memsz > hi) hi = info->dlpi_addr + ph.p_vaddr + ph.p_memsz;
  }
  g_known[g_nknown++] = Known{info->dlpi_addr, lo, hi};
  patch_object(info, lo, hi);
  return 0;
}

struct Probe {
  uintptr_t base;
  bool found;
};
int still_loaded(struct dl_phdr_info* info, size_t, void* data) {
  Probe* p = (Probe*)data;
  if (info->dlpi_addr == p->base) p->found = true;
  return 0;
}

void lock_scan() {
  while (__atomic_exchange_n(&g_scan_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
}
void unlock_scan() { __atomic_store_n(&g_scan_lock, 0, __ATOMIC_RELEASE); }

void rescan_loaded() {
  lock_scan();
  dl_iterate_phdr(scan_object, nullptr);
  unlock_scan();
}

// After dlclose: forget objects that are gone, so their addresses are never written again.
void forget_unloaded() {
  lock_scan();
  for (uint32_t i = 0; i < g_nknown;) {
    Probe probe{g_known[i].base, false};
    dl_iterate_phdr(still_loaded, &probe);
    if (probe.found) {
      i++;
      continue;
    }
    uint32_t n = __atomic_load_n(&g_ctl->nlate, __ATOMIC_ACQUIRE);
    for (uint32_t s = 0; s < n; s++) {
      PatchedSlot& ls = g_ctl->late[s];
      if (ls.addr >= g_known[i].lo && ls.addr < g_known[i].hi)
        __atomic_store_n(&ls.state, (uint16_t)kSlotGone, __ATOMIC_RELEASE);
    }
    g_known[i] = g_known[--g_nknown];
  }
  unlock_scan();
}

void forked_child() { g_session.mode = kOff; }  // the child must not write into the parent's rings

void restore_slots(PatchedSlot* slots, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    PatchedSlot& s = slots[i];
    if (__atomic_load_n(&s.state, __ATOMIC_ACQUIRE) != kSlotPatched) continue;
    uint64_t* slot = (uint64_t*)s.addr;
    if (__atomic_load_n(slot, __ATOMIC_RELAXED) == s.hook &&
        write_slot(slot, s.original, s.readonly))
      __atomic_store_n(&s.state, (uint16_t)kSlotEmpty, __ATOMIC_RELEASE);
  }
}

int g_abandoning;

// memhook stopped beating: pass everything through, put every slot back, give the rings' pages
// back. Runs once, on whichever thread noticed; takes only the scan lock (dlopen hooks' own).
__attribute__((noinline)) void abandon() {
  if (__atomic_exchange_n(&g_abandoning, 1, __ATOMIC_ACQUIRE)) return;
  __atomic_store_n(&g_session.mode, kOff, __ATOMIC_RELEASE);
  Control* c = g_ctl;
  lock_scan();
  restore_slots(c->slots, std::min<uint32_t>(c->nslots, kMaxSlots));
  restore_slots(c->late, std::min<uint32_t>(c->nlate, kMaxLateSlots));
  unlock_scan();
  const size_t rings = rings_offset();
  madvise((uint8_t*)c + rings, segment_bytes(g_nrings, g_ring_bytes, g_depth) - rings, MADV_REMOVE);
  madvise(g_table, sizeof g_table, MADV_DONTNEED);
  __atomic_store_n(&c->abandoned, 1, __ATOMIC_RELEASE);
}

void check_consumer() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  uint64_t now = uint64_t(ts.tv_sec) * 1000000000u + ts.tv_nsec;
  uint64_t beat = __atomic_load_n(&g_ctl->heartbeat_ns, __ATOMIC_RELAXED);
  if (beat && now > beat + g_ctl->abandon_after_ns && active()) abandon();
}

}  // namespace

// ---- The hooks. ----
// A: allocate, F: free, R: realloc-like, L: dynamic loader.

#define PASS_THROUGH(sym, args)                                        \
  ThreadState& t = t_state;                                            \
  if (__builtin_expect(!active() || t.in_hook, 0)) return REAL(sym) args;

#define UNPAREN(...) __VA_ARGS__

// Allocation hooks. memhook_hook_* records (or, when memhook is inactive, the call nested,
// filtered out or not sampled, passes straight to the real function); the backtrace starts at
// its call site. Full tracing takes the short path in the compiled hook (framed_*) itself, whose
// frame sits directly below the caller's; everything else (a size filter, sampling, operator
// new, nested or inactive calls) goes to general_*, which walks from the hook's frame all the
// same (a sibling call reuses it).
// Sampling sessions point slots at memhook_sample_* instead: it counts the thread's countdown
// down and tail-calls the real function while no sample is due (a few instructions, no frame
// of its own), else tail-calls framed_*. Sessions with a size filter point them at
// memhook_filter_*, the compiled hook itself.
// memhook_hook_* (every call) is the compiled hook itself (framed_*), or for malloc, the hottest
// of them, an assembly entry below that records every call, and falls back to it.
#define FRAMED_ENTRY(sym, ret, params)                                 \
  extern "C" __attribute__((visibility("default"), alias("framed_" #sym))) ret \
  memhook_hook_##sym params;
#define ASM_ENTRY(sym, ret, params) extern "C" ret memhook_hook_##sym params;
#define HOOK_A(...) HOOK_A_WITH(FRAMED_ENTRY, __VA_ARGS__)

#define HOOK_A_WITH(ENTRY, sym, ret, params, args, size_expr, result_ptr) \
  __attribute__((noinline)) static ret general_##sym(void** fp, UNPAREN params) { \
    ThreadState& t = t_state;                                          \
    const uint64_t size = (size_expr);                                 \
    const int m = mode();                                              \
    if (m == kOff || t.in_hook || (m == kSelective && !chosen_slow(t, size))) { \
      if (!kNests[ID_##sym]) return REAL(sym) args;                    \
      Guard guard(t);                                                  \
      return REAL(sym) args;                                           \
    }                                                                  \
    Guard guard(t);                                                    \
    ret result = REAL(sym) args;                                       \
    if (void* p = (result_ptr)) {                                      \
      if (g_sample_rate) count_sampled((uint64_t)p, +1);               \
      record_alloc(t, ID_##sym, p, size, origin_of(fp));               \
    }                                                                  \
    return result;                                                     \
  }                                                                    \
  extern "C" __attribute__((visibility("hidden"))) ret framed_##sym params { \
    ThreadState& t = t_state;                                          \
    void** fp = (void**)__builtin_frame_address(0);                    \
    /* operator new keeps the guard across its inner malloc: general_* */ \
    if (__builtin_expect(mode() != kEvery || t.in_hook, 0) || kNests[ID_##sym]) \
      return general_##sym(fp, UNPAREN args);                          \
    const uint64_t size = (size_expr);                                 \
    ret result = REAL(sym) args;                                       \
    /* fp read again: held across the call it would cost a register */ \
    if (void* p = (result_ptr))                                        \
      record_alloc_now<ID_##sym>(p, size, origin_of((void**)__builtin_frame_address(0))); \
    return result;                                                     \
  }                                                                    \
  ENTRY(sym, ret, params)                                              \
  /* 64-byte aligned: straddling a line cost it 0.03x at 16 B */      \
  extern "C" __attribute__((visibility("default"), optimize("omit-frame-pointer"), \
                            aligned(64))) ret                          \
  memhook_sample_##sym params {                                        \
    ThreadState& t = t_state;                                          \
    if (__builtin_expect(count_down(t, (size_expr)), 1)) {             \
      if (!kNests[ID_##sym]) return REAL(sym) args;                    \
      Guard guard(t); /* its inner malloc is this call, not another */ \
      return REAL(sym) args;                                           \
    }                                                                  \
    return framed_##sym args;                                          \
  }                                                                    \
  extern "C" __attribute__((visibility("default"), alias("framed_" #sym))) ret \
  memhook_filter_##sym params;

// Frees are recorded before the real call. In sampling mode only frees of sampled blocks are
// recorded (sampled_live says which), and the sampling entry (memhook_sample_*) passes every
// other free straight to the real function. Plain free calls nothing hooked: on its short path
// the guard ends before it, and it is a tail call.
#define HOOK_F(sym, ret, params, args)                                 \
  __attribute__((noinline)) static ret general_##sym(void** fp, UNPAREN params) { \
    if (!p) return REAL(sym) args;                                     \
    PASS_THROUGH(sym, args)                                            \
    enter(t);                                                          \
    if (!g_sample_rate || sampled_live((uint64_t)p)) {                 \
      record_free(t, ID_##sym, p, fp);                                 \
      if (g_sample_rate) count_sampled((uint64_t)p, -1);               \
    }                                                                  \
    REAL(sym) args;                                                    \
    leave(t);                                                          \
  }                                                                    \
  extern "C" __attribute__((visibility("default"))) ret memhook_hook_##sym params { \
    ThreadState& t = t_state;                                          \
    void** fp = (void**)__builtin_frame_address(0);                    \
    /* operator delete keeps the guard across its inner free: general_* */ \
    if (__builtin_expect(!p || mode() != kEvery || t.in_hook, 0) || ID_##sym != ID_free) \
      return general_##sym(fp, UNPAREN args);                          \
    enter(t);                                                          \
    record_free(t, ID_##sym, p, fp);                                   \
    leave(t);                                                          \
    return REAL(sym) args;                                             \
  }                                                                    \
  extern "C" __attribute__((visibility("default"), optimize("omit-frame-pointer"))) ret \
  memhook_sample_##sym params {                                        \
    if (!p || !sampled_live((uint64_t)p)) return REAL(sym) args;       \
    return memhook_hook_##sym args;                                    \
  }

HOOK_A_WITH(ASM_ENTRY, malloc, void*, (size_t n), (n), n, result)
HOOK_A(calloc, void*, (size_t c, size_t n), (c, n), c * n, result)
HOOK_A(aligned_alloc, void*, (size_t a, size_t n), (a, n), n, result)
HOOK_A(memalign, void*, (size_t a, size_t n), (a, n), n, result)
HOOK_A(valloc, void*, (size_t n), (n), n, result)
HOOK_A(pvalloc, void*, (size_t n), (n), page_round(n), result)
HOOK_A(posix_memalign, int, (void** out, size_t a, size_t n), (out, a, n), n,
       result == 0 ? *out : nullptr)
HOOK_A(_Znwm, void*, (size_t n), (n), n, result)
HOOK_A(_Znam, void*, (size_t n), (n), n, result)
HOOK_A(_ZnwmRKSt9nothrow_t, void*, (size_t n, const void* tag), (n, tag), n, result)
HOOK_A(_ZnamRKSt9nothrow_t, void*, (size_t n, const void* tag), (n, tag), n, result)
HOOK_A(_ZnwmSt11align_val_t, void*, (size_t n, size_t a), (n, a), n, result)
HOOK_A(_ZnamSt11align_val_t, void*, (size_t n, size_t a), (n, a), n, result)
HOOK_A(_ZnwmSt11align_val_tRKSt9nothrow_t, void*, (size_t n, size_t a, const void* tag),
       (n, a, tag), n, result)
HOOK_A(_ZnamSt11align_val_tRKSt9nothrow_t, void*, (size_t n, size_t a, const void* tag),
       (n, a, tag), n, result)

// memhook_hook_malloc's record when its own (below) does not apply, with the origin as that
// entry found it.
extern "C" __attribute__((visibility("hidden"), noinline, optimize("omit-frame-pointer"))) void*
memhook_record_malloc(void* p, uint64_t size, void** ret, void** frame) {
  if (mode() != kEvery) return p;  // a call that entered as memhook changed modes (or detached)
  return record_alloc_leaf<ID_malloc>(p, size, Origin{ret, frame});
}

// memhook_hook_malloc: full tracing's common case by hand. It has no frame of its own (its caller's
// frame pointer is still in %rbp, its return address at (%rsp)), and its record, when a stack
// slot holds the stack and the ring has room, keeps every value in the scratch registers a leaf
// may use freely (compiled, the record saved five more and spent a third more instructions).
// It calls the real malloc first and decides after it, in one compare of the session word with
// the thread's: a nested call (the guard set: operator new's malloc, or a signal handler's during
// a record) returns unrecorded, as framed_malloc would; anything else (no ring yet, no room, a
// slot that does not hold the stack, or memhook no longer tracing every call) goes to
// memhook_record_malloc, which decides again.
//
// Its dependency is the table entry's as found, without asking whose it is: when another
// pointer's, it names an earlier event (the entry was written before this hook read it), which
// costs the consumer at most a wait, and the consumer itself looks for a pending free of a block
// it still holds live (Consumer::free_pending in consumer.cpp).
static_assert(offsetof(ThreadState, write) == 0 && offsetof(ThreadState, lap_base) == 16 &&
              offsetof(ThreadState, ring) == 24 && offsetof(ThreadState, generation) == 56 &&
              offsetof(ThreadState, in_hook) == 60 && offsetof(ThreadState, stacks) == 64 &&
              offsetof(ThreadState, alloc_until) == 80 &&
              offsetof(ThreadState, entry_bias) == 88 && offsetof(ThreadState, last_slot) == 96 &&
              offsetof(RingHeader, write) == 8 && offsetof(StackCache, frame) == 0 &&
              offsetof(StackCache, ret0) == 8 && offsetof(StackCache, compare) == 24 &&
              offsetof(StackCache, slot_word) == 32 && offsetof(StackCache, pairs) == 64 &&
              kStackSlots == 32 && kPtrBits == 47 && kTagMask == 0x1fffff && kTableBits == 22 &&
              kDepShift == 24 && kAlignedPairs == 32 && kGolden32 == 0x9E3779B9 &&
              header(kAlloc, ID_malloc, 0, 0) == 0x101 && kEvery == 0 &&
              offsetof(Session, mode) == 4 && sizeof(ThreadState::in_hook) == 4,
              "memhook_hook_malloc reads these as constants");
asm(R"(
  # The record once the slot's stack compared equal (%xmm1 zero). In: %rax = p (returned as
  # is), %rsi = size, %rdx = the table tag, %r9 = the slot, %r10 = w, %r11 = the state.
  .macro memhook_malloc_record
  ptest %xmm1, %xmm1            # SSE4.1 (memhook_start checks)
  jnz memhook_compare_miss
  # header(kAlloc, malloc, 0 frames, dependency), pointer word, size word.
  movq %fs:16(%r11), %r8        # where it goes: %r8 + w
  movq %rax, 8(%r8,%r10)        # p: its depth bits are the slot's (segment.h)
  orq 32(%r9), %rsi
  movq %rsi, 16(%r8,%r10)       # size | (slot + 1) << 56 (a returned block's size is below 2^56)
  # The entry, then table_index(): this event becomes p's latest, the old one its dependency.
  movq %r10, %r9
  shlq $21, %r9
  addq %fs:88(%r11), %r9
  orq %rdx, %r9                 # table_entry(tag, kLive, this event)
  imull $0x9E3779B9, %edx, %edx
  movq %rax, %rcx
  shrq $4, %rcx
  xorq %rcx, %rdx
  andl $0x3fffff, %edx
  leaq memhook_table(%rip), %rcx
  movq (%rcx,%rdx,8), %rsi      # the old entry
  movq %r9, (%rcx,%rdx,8)
  andq $-0x1000000, %rsi
  orq $0x101, %rsi
  movq %rsi, (%r8,%r10)
  addq $24, %r10
  movq %r10, %fs:0(%r11)
  movq %fs:24(%r11), %rcx
  movq %r10, 8(%rcx)            # published
  movq %rdi, %fs:56(%r11)       # the guard cleared, as an 8-byte store the next compare reads
  ret
  .endm

  .text
  .globl memhook_hook_malloc
  .type memhook_hook_malloc, @function
  .p2align 6                    # its entry and checks in one fetch line
memhook_hook_malloc:
  .cfi_startproc
  pushq %rdi                    # the size, and the stack aligned for the call
  .cfi_adjust_cfa_offset 8
  call *memhook_g_real+8(%rip)
  popq %rsi
  .cfi_adjust_cfa_offset -8
  testq %rax, %rax
  je 7f
  movq memhook_t_state@gottpoff(%rip), %r11
  movq memhook_session(%rip), %rdi
  cmpq %fs:56(%r11), %rdi       # tracing every call, this session's ring claimed, the guard clear
  jne 6f                        # (and the same 8 bytes clear the guard at the end)
  movl $1, %fs:60(%r11)         # the guard, before the cursor is read
  movq %fs:0(%r11), %r10        # w
  cmpq %fs:80(%r11), %r10
  jae memhook_compare_miss      # no room without a look at the consumer
  movq %rax, %rdx
  shrq $26, %rdx                # the table tag, below 2^21 for a user-space pointer
  cmpq $0x200000, %rdx
  jae memhook_compare_miss
  movq (%rsp), %r8              # ret0
  movq %fs:96(%r11), %r9        # the slot of this thread's latest allocation first
  cmpq %rbp, (%r9)
  jne 5f
  cmpq %r8, 8(%r9)
  jne 5f
4:
  pxor %xmm1, %xmm1
  movq %rbp, %rcx               # f_1
  jmp *24(%r9)
  # Step j: xmm1 |= f[0..1] ^ pairs[j]; f = pairs[j].next (same_stack()). The pair is loaded once
  # and the next frame taken from its register: loads are what this loop runs short of.
  .macro memhook_step_avx512 pair
  vmovdqu (%rcx), %xmm0
  {disp32} vmovdqa \pair(%r9), %xmm3
  vmovq %xmm3, %rcx
  vpternlogq $0xf6, %xmm3, %xmm0, %xmm1
  .endm
  .macro memhook_step_sse pair
  movdqu (%rcx), %xmm0
  {disp32} movdqa \pair(%r9), %xmm3
  movq %xmm3, %rcx
  pxor %xmm3, %xmm0
  por %xmm0, %xmm1
  .endm
  # Steps 0..30 at `first`, equal in size, then step 31 at `last`, which follows no pointer.
  .macro memhook_compare_steps first, last, step, bytes
\first:
  .set pair, 0
  .rept 31
  \step 64+16*pair
  .set pair, pair + 1
  .endr
\last:
  .if \last - \first - 31 * \bytes
  .error "the comparison's steps differ in size"
  .endif
  .endm
  memhook_compare_steps memhook_compare_avx512, memhook_compare_avx512_last, memhook_step_avx512, 25
  vmovdqu (%rcx), %xmm0
  vpternlogq $0xf6, 64+16*31(%r9), %xmm0, %xmm1
  memhook_malloc_record
  memhook_compare_steps memhook_compare_sse, memhook_compare_sse_last, memhook_step_sse, 26
  movdqu (%rcx), %xmm0
  pxor 64+16*31(%r9), %xmm0
  por %xmm0, %xmm1
  memhook_malloc_record
6:
  cmpl $0, %fs:60(%r11)
  jne 7f                        # nested (a hook's own call, or a handler during a record)
  jmp memhook_compare_miss      # no ring yet
5:
  movq %rsp, %r9
  xorq %r8, %r9
  imull $0x9E3779B9, %r9d, %r9d
  shrl $27, %r9d                # the stack slot (stack_slot())
  imull memhook_g_stack_stride(%rip), %r9d
  addq %fs:64(%r11), %r9        # its StackCache
  cmpq %rbp, (%r9)
  jne memhook_compare_miss
  cmpq %r8, 8(%r9)
  jne memhook_compare_miss
  movq %r9, %fs:96(%r11)        # last_slot
  jmp 4b
memhook_compare_miss:
  movq %rax, %rdi
  movq %rsp, %rdx               # where the return address is
  movq %rbp, %rcx               # the caller's frame
  jmp memhook_record_malloc     # returns p
7:
  ret
  .cfi_endproc
  .size memhook_hook_malloc, .-memhook_hook_malloc
  .hidden memhook_compare_avx512
  .hidden memhook_compare_avx512_last
  .hidden memhook_compare_sse
  .hidden memhook_compare_sse_last
  .hidden memhook_compare_miss
  .globl memhook_compare_avx512
  .globl memhook_compare_avx512_last
  .globl memhook_compare_sse
  .globl memhook_compare_sse_last
  .globl memhook_compare_miss
)");

HOOK_F(free, void, (void* p), (p))
HOOK_F(_ZdlPv, void, (void* p), (p))
HOOK_F(_ZdaPv, void, (void* p), (p))
HOOK_F(_ZdlPvm, void, (void* p, size_t n), (p, n))
HOOK_F(_ZdaPvm, void, (void* p, size_t n), (p, n))
HOOK_F(_ZdlPvSt11align_val_t, void, (void* p, size_t a), (p, a))
HOOK_F(_ZdaPvSt11align_val_t, void, (void* p, size_t a), (p, a))
HOOK_F(_ZdlPvmSt11align_val_t, void, (void* p, size_t n, size_t a), (p, n, a))
HOOK_F(_ZdaPvmSt11align_val_t, void, (void* p, size_t n, size_t a), (p, n, a))
HOOK_F(_ZdlPvRKSt9nothrow_t, void, (void* p, const void* tag), (p, tag))
HOOK_F(_ZdaPvRKSt9nothrow_t, void, (void* p, const void* tag), (p, tag))
HOOK_F(_ZdlPvSt11align_val_tRKSt9nothrow_t, void, (void* p, size_t a, const void* tag),
       (p, a, tag))
HOOK_F(_ZdaPvSt11align_val_tRKSt9nothrow_t, void, (void* p, size_t a, const void* tag),
       (p, a, tag))

// realloc-like: `old` stops being ours when the call starts, the result is ours when it returns,
// so the record is reserved and `old` entered in the table before the call, and published after.
// Always one counted event: the dependency written for `old` names it.
static void* record_realloc(ThreadState& t, int op, void* old, uint64_t size, bool track_old,
                            bool track_new, void** fp,
                            void* (*call)(void*, uint64_t, uint64_t), uint64_t a1, uint64_t a2) {
  if (!event_ring(t, track_old)) return call(old, a1, a2);
  RingHeader* r = t.ring;
  __atomic_store_n(&r->busy, 1, __ATOMIC_RELAXED);
  uint64_t w;
  if (!reserve(t, 8 * (5 + g_depth), &w)) {
    // No room for an allocation: the new block goes unrecorded, but the free of `old` is
    // recorded all the same in a free's room, unless even that is full.
    if (!track_old || !reserve(t, 16, &w, true)) {
      track_old ? drop_free(r) : drop(r);
      void* p = call(old, a1, a2);
      end_busy(r);
      return p;
    }
    drop(r);
    track_new = false;
  }
  uint64_t* at = slot_at(t, w);
  uint64_t dep_old = track_old ? table_swap(t, (uint64_t)old, 0, w) : 0;
  void* p = call(old, a1, a2);
  // Failure leaves `old` untouched (still live); a zero size frees it, as glibc does.
  bool old_freed = track_old && (p || size == 0);
  if (track_old && !old_freed) table_swap(t, (uint64_t)old, kLive, w);
  if (g_sample_rate) {  // raise before lowering: an in-place realloc's counter never reads 0
    if (p && track_new) count_sampled((uint64_t)p, +1);
    if (old_freed) count_sampled((uint64_t)old, -1);
  }
  size_t words = 1;
  if (p && track_new) {
    size_t head = old_freed ? 5 : 3;
    const StackWords s = stack_words(t, origin_of(fp), (uint64_t)p, size, at + head);
    at[0] = header(old_freed ? kRealloc : kAlloc, op, s.nframes,
                   table_swap(t, (uint64_t)p, kLive, w));
    at[1] = s.ptr;
    at[2] = s.size;
    if (old_freed) {
      at[3] = (uint64_t)old;
      at[4] = dep_old;
    }
    words = head + s.nframes;
  } else if (old_freed) {
    at[0] = header(kFree, op, 0, dep_old);
    at[1] = with_depth(t, (uint64_t)old, (uint64_t)fp);
    words = 2;
  } else {
    at[0] = header(kNop, op, 0, 0);
  }
  publish(t, w + 8 * words);
  end_busy(r);
  return p;
}

static void* call_realloc(void* p, uint64_t n, uint64_t) { return REAL(realloc)(p, n); }
static void* call_reallocarray(void* p, uint64_t c, uint64_t n) { return REAL(reallocarray)(p, c, n); }

#define HOOK_R(sym, params, args, size_expr, a1, a2)                   \
  extern "C" __attribute__((visibility("default"))) void* memhook_hook_##sym params { \
    PASS_THROUGH(sym, args)                                            \
    uint64_t size = (size_expr);                                       \
    bool track_old = p && (!g_sample_rate || sampled_live((uint64_t)p)); \
    bool track_new = !g_selective || chosen(t, size);                  \
    if (!track_old && !track_new) return REAL(sym) args;               \
    t.in_hook = 1;                                                     \
    void* result = record_realloc(t, ID_##sym, p, size, track_old, track_new, \
                                  (void**)__builtin_frame_address(0), call_##sym, a1, a2); \
    t.in_hook = 0;                                                     \
    return result;                                                     \
  }

HOOK_R(realloc, (void* p, size_t n), (p, n), n, n, 0)
HOOK_R(reallocarray, (void* p, size_t c, size_t n), (p, c, n), c * n, c, n)

extern "C" __attribute__((visibility("default"))) void* memhook_hook_dlopen(const char* f, int m) {
  void* h = REAL(dlopen)(f, m);
  if (h && active()) rescan_loaded();
  return h;
}

extern "C" __attribute__((visibility("default"))) int memhook_hook_dlclose(void* h) {
  int rc = REAL(dlclose)(h);
  if (active()) forget_unloaded();
  return rc;
}

// ---- Entry points memhook calls through GDB. ----

namespace {

// The address range of the latest session's segment. Never unmapped: a hook that read a ring
// pointer just before detach may still write through it, and must not fault.
void* g_region;
size_t g_region_bytes;

bool previous_rings_idle() {
  for (uint32_t i = 0; i < g_nrings; i++)
    if (__atomic_load_n(&ring_at(i)->busy, __ATOMIC_ACQUIRE)) return false;
  return true;
}

// Where the new segment (mapped at `fresh`) will live. Each attach would otherwise leave the
// previous segment's range mapped (its pages long released), some 300 MB of address space per
// session, which a target under RLIMIT_AS would feel. So the new segment replaces the previous
// one in place when it fits and the previous session ended cleanly (detached, no realloc still
// inside the real call). Replacing is one mmap: the range is never unmapped, so a straggling
// write lands in the new segment (the consumer checks what it reads) rather than faulting.
void* settle_segment(void* fresh, size_t bytes, int fd, bool was_active) {
  if (g_region && !was_active && bytes <= g_region_bytes && previous_rings_idle()) {
    void* at = mmap(g_region, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (at == g_region) {
      munmap(fresh, bytes);
      return at;
    }
  }
  g_region = fresh;
  g_region_bytes = bytes;
  return fresh;
}

}  // namespace

// Map the segment and arm the hooks. Runs on one target thread with GDB holding the process;
// allocates nothing itself. Returns 0, or a negative code naming what failed.
extern "C" __attribute__((visibility("default"))) int memhook_start(const char* shm_path) {
  unsigned eax, ebx, ecx, edx;  // memhook_hook_malloc uses ptest
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_SSE4_1)) return -5;
  // The comparison's AVX-512 sequence (vpternlogq) needs AVX-512VL and the kernel keeping its
  // state.
  unsigned xcr0 = 0, xcr0_hi;
  if (ecx & bit_OSXSAVE) asm("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0));
  const bool avx512 = (xcr0 & 0xe6) == 0xe6 && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
                      (ebx & bit_AVX512F) && (ebx & bit_AVX512VL);
  int fd = open(shm_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(Control)) {
    close(fd);
    return -2;
  }
  const size_t bytes = (size_t)st.st_size;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return -3;
  }
  Control* c = (Control*)m;
  if (c->magic != kMagic || c->version != kVersion || c->control_bytes != sizeof(Control) ||
      bytes < segment_bytes(c->nrings, c->ring_bytes, c->depth) || c->depth > kMaxDepth ||
      c->depth < 1 || (c->ring_bytes & (c->ring_bytes - 1)) != 0 || c->nrings > kMaxRings) {
    munmap(m, bytes);
    close(fd);
    return -4;
  }
  const bool was_active = active();
  g_session.mode = kOff;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  m = settle_segment(m, bytes, fd, was_active);
  close(fd);
  c = (Control*)m;
  g_ctl = c;
  memhook_ctl = c;
  // Anonymous zero pages (the table is page-aligned, so none shares a page with .data): the
  // previous session's entries are gone.
  madvise(g_table, sizeof g_table, MADV_DONTNEED);
  g_rings = (uint8_t*)m + rings_offset();
  g_stack_caches = (uint8_t*)m + stack_caches_offset(c->nrings, c->ring_bytes);
  g_stack_stride = (uint32_t)stack_cache_stride(c->depth);
  const bool use_avx512 = avx512 && !c->no_avx512;
  g_compare_first = use_avx512 ? memhook_compare_avx512 : memhook_compare_sse;
  g_compare_last = use_avx512 ? memhook_compare_avx512_last : memhook_compare_sse_last;
  g_nrings = c->nrings;
  g_ring_bytes = c->ring_bytes;
  g_depth = c->depth;
  g_clock = c->clock;
  g_sample_rate = c->sample_rate;
  g_size_filter = c->min_size || c->max_size != UINT64_MAX;
  g_selective = c->sample_rate || g_size_filter;
  g_min_size = c->min_size;
  g_max_size = c->max_size;
  for (int id = 1; id < kMaxHooks; id++)
    if (c->real[id]) g_real[id] = (void*)c->real[id];
  // Late-loaded libraries get the same entries memhook chose for this session (hooks.py).
#define ENTRY_A(sym)                            \
  (c->sample_rate   ? (void*)&memhook_sample_##sym \
   : g_size_filter ? (void*)&memhook_filter_##sym \
                   : (void*)&memhook_hook_##sym)
#define ENTRY_F(sym) (c->sample_rate ? (void*)&memhook_sample_##sym : (void*)&memhook_hook_##sym)
#define ENTRY_R(sym) (void*)&memhook_hook_##sym
#define ENTRY_L(sym) (void*)&memhook_hook_##sym
#define HOOK(id, sym, name, kind, ret, params, args) g_hook_fn[id] = ENTRY_##kind(sym);
#include "hooks.def"
#undef HOOK
  uintptr_t hi = (uintptr_t)__libc_stack_end;
  struct rlimit rl;
  uintptr_t limit = (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                        ? rl.rlim_cur
                        : (uintptr_t)1 << 30;
  // Every frame of the main thread lies below __libc_stack_end (argv/envp are above it).
  g_main_stack_hi = hi;
  g_main_stack_lo = hi - limit;
  g_nknown = 0;
  for (uint32_t i = 0; i < c->nknown && i < (uint32_t)kMaxKnownObjects; i++)
    g_known[g_nknown++] = Known{c->known_bases[i], 0, 0};
  Dl_info self;
  if (dladdr((void*)&memhook_start, &self)) {
    c->lib_base = (uint64_t)self.dli_fbase;
    // Never patch ourselves: our own dlopen slot must reach the real dlopen.
    if (g_nknown < (uint32_t)kMaxKnownObjects) g_known[g_nknown++] = Known{c->lib_base, 0, 0};
  }
  static bool once;
  if (!once) {
    once = true;
    pthread_atfork(nullptr, nullptr, forked_child);
  }
  memset(g_sampled, 0, sizeof g_sampled);  // the new table has no sampled block
  g_session.generation++;
  g_abandoning = 0;
  c->started = 1;
  __atomic_store_n(&g_session.mode, g_selective ? kSelective : kEvery, __ATOMIC_RELEASE);
  return 0;
}

// Patch libraries that appeared between memhook's scan and its attach.
extern "C" __attribute__((visibility("default"))) int memhook_rescan() {
  if (!active()) return -1;
  rescan_loaded();
  return (int)g_ctl->nlate;
}
