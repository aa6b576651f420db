// Each thread's state inside the hooks: its ring and cursors, its stack's bounds, and the
// recursion guard (the one guard API: Guard around a real call, enter/leave around a record).
#pragma once
#include <errno.h>
#include <sys/ioctl.h>

namespace memhook {

// The assembly entry reads the fields on the first cache line at offsets asm_offsets.h gives.
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
  uint8_t* recent;   // the ring's stack caches
  uint64_t free_until;  // fast_until for frees, which may also use the ring's free headroom
  uint64_t alloc_until;  // memhook_hook_malloc's bound: a 24-byte record fits at w < alloc_until
  uint64_t entry_bias;   // + (w << 21): the table entry of a live block allocated at w (this lap)
  RecentStack* last_recent;  // the recent stack of its latest allocation: the malloc hook looks there first
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
  uint32_t unclaimed_generation;  // the session in which this thread found every ring taken
  uint32_t unclaimed_events;      // its events since (claim_ring tries again every 64th)
  uint64_t wait_again_at;  // a bounded wait ran out: drop, not wait, until `read` passes this
  int64_t wait_credit_ns;   // how long it may still wait for room (full_ring.h), as of credit_at
  uint64_t credit_at;       // 0: not yet counted since the ring was claimed
};
}  // namespace memhook

// Global (hidden): malloc_entry.S reads it. musl refuses initial-exec TLS in a library dlopen
// loads; there it is reached through a TLS descriptor (the musl build's -mtls-dialect=gnu2),
// which costs a call that clobbers nothing but %rax. musl allocates every thread's block at dlopen.
#ifdef MEMHOOK_MUSL
#define MEMHOOK_TLS_MODEL "global-dynamic"
#else
#define MEMHOOK_TLS_MODEL "initial-exec"
#endif
__thread memhook::ThreadState t_state asm("memhook_t_state") __attribute__((tls_model(MEMHOOK_TLS_MODEL)));

namespace {

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

// Linux 6.11's PROCMAP_QUERY (linux/fs.h, which older headers lack): the mapping that holds an
// address, asked of /proc/self/maps in one ioctl instead of reading its text.
struct ProcmapQuery {
  uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size;
  uint64_t vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104, "the kernel's size, which the request number holds");
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);

// The mapping that holds `addr`, [*lo, *hi), from /proc/self/maps with raw system calls into
// this frame's buffer: no lock of glibc's taken, no allocation, no cancellation point. Asked by
// PROCMAP_QUERY where the kernel has it: reading the text took 138-1,170 us with 400 threads'
// stacks listed, the query 10-12 us (benchmarks/thread_start.py's case, in a C probe). False
// where /proc is not mounted, or no mapping holds it.
inline bool mapping_of(uintptr_t addr, uintptr_t* lo, uintptr_t* hi) {
  const int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ProcmapQuery q{};
  q.size = sizeof q;
  q.query_addr = addr;  // query_flags 0: only a mapping that holds it
  const long asked = syscall(SYS_ioctl, fd, kProcmapQuery, &q);
  if (asked == 0 || errno == ENOENT) {  // (ENOENT: no mapping holds it; other errors: no query)
    syscall(SYS_close, fd);
    if (asked != 0) return false;
    *lo = (uintptr_t)q.vma_start, *hi = (uintptr_t)q.vma_end;
    return true;
  }
  char buf[2048];
  size_t have = 0;
  bool found = false, skipping = false;  // skipping: the rest of a line longer than buf
  for (;;) {
    const long n = syscall(SYS_read, fd, buf + have, sizeof buf - have);
    if (n <= 0) break;
    have += size_t(n);
    size_t at = 0;
    for (;;) {
      const char* nl = buf + at;  // (loops, not memchr and memmove: no new PLT entries)
      while (nl < buf + have && *nl != '\n') nl++;
      if (nl == buf + have) break;
      if (!skipping) {  // "lo-hi perms ...": two hex numbers
        uintptr_t a = 0, b = 0;
        const char* c = buf + at;
        for (; *c != '-' && c < nl; c++) a = a * 16 + uintptr_t(*c <= '9' ? *c - '0' : *c - 'a' + 10);
        for (c++; *c != ' ' && c < nl; c++) b = b * 16 + uintptr_t(*c <= '9' ? *c - '0' : *c - 'a' + 10);
        if (addr >= a && addr < b) {
          *lo = a, *hi = b;
          found = true;
          break;
        }
      }
      skipping = false;
      at = size_t(nl - buf) + 1;
    }
    if (found) break;
    if (at == 0 && have == sizeof buf) {  // a line longer than the buffer: its head was read
      skipping = true;
      at = have;
    }
    for (size_t i = at; i < have; i++) buf[i - at] = buf[i];
    have -= at;
  }
  syscall(SYS_close, fd);
  return found;
}

// Where this thread's stack lies: the main thread's bounds memhook gave; another thread's, the
// mapping its stack pointer is in. Not pthread_getattr_np: it holds the thread's own lock around
// a realloc, so a thread whose first event of the session was that realloc (the JVM asks at
// every thread's start) waited for itself. Only without /proc is it asked (glibc's reallocs
// then pass through: the guard is set).
void thread_stack_bounds(ThreadState& t) {
  if (t.tid == (uint32_t)g_ctl->target_pid) {
    t.stack_lo = g_main_stack_lo;
    t.stack_hi = g_main_stack_hi;
    return;
  }
  t.stack_lo = t.stack_hi = 0;
  uintptr_t lo, hi;
  const int saved_errno = errno;  // (the program's, whatever the calls below set)
  struct Restore {
    int e;
    ~Restore() { errno = e; }
  } restore{saved_errno};
  stack_t ss;  // (in a handler on the alternate signal stack, that is not the thread's stack)
  const bool on_alternate = syscall(SYS_sigaltstack, nullptr, &ss) == 0 && (ss.ss_flags & SS_ONSTACK);
  if (!on_alternate && mapping_of((uintptr_t)__builtin_frame_address(0), &lo, &hi)) {
    t.stack_lo = lo;
    t.stack_hi = hi;
    return;
  }
  pthread_attr_t attr;
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

}  // namespace
