// The ring writer: each thread owns one single-producer ring of the shared segment (claimed
// once per session), reserves room for a record, writes it in place and publishes it. A full
// ring waits a bounded time for room (full_ring.h), then drops the event and counts it.
#pragma once

namespace {

RingHeader* ring_at(uint32_t i) {
  return (RingHeader*)(g_rings + size_t(i) * ring_stride(g_ring_bytes));
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
  const uint64_t limit = is_free ? cap : cap - headroom;
  if (used > limit) {
    const uint64_t rd = wait_for_room(t, w + pad + need, limit);
    if (rd == UINT64_MAX) return UINT64_MAX;
    t.cached_read = rd;
  }
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
  const uint64_t half = t.cached_read + cap / 2, until = min_of((w | (cap - 1)) + 1, t.next_time);
  t.fast_until = min_of(until, w < half ? half : t.cached_read + cap - headroom);
  t.free_until = min_of(until, w < half ? half : t.cached_read + cap);
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
inline uint64_t* record_at(ThreadState& t, uint64_t w) { return (uint64_t*)(t.lap_base + w); }

inline void publish(ThreadState& t, uint64_t end) {
  t.write = end;
  __atomic_store_n(&t.ring->write, end, __ATOMIC_RELEASE);
}

// A record that is not an event (time, thread): published on its own.
void write_marker(ThreadState& t, uint64_t head, uint64_t value, size_t words) {
  uint64_t w;
  if (!reserve(t, 8 * words, &w)) return;
  uint64_t* at = record_at(t, w);
  at[0] = head;
  if (words > 1) at[1] = value;
  publish(t, w + 8 * words);
}

constexpr uintptr_t kClaimPopulate = 64 << 10;  // ring bytes a claim faults in
uint32_t g_claim_from;  // where the next claim starts looking (claim_ring)

// Slow path, once per thread per attach: own a ring. A ring whose owner thread has exited is
// taken over; its cursors carry on, so nothing already written is lost.
__attribute__((noinline)) RingHeader* claim_ring(ThreadState& t) {
  // Every ring held by a live thread at this thread's last try: try again only every 64th event
  // (a try costs a signal-0 syscall per ring; a crowd of threads beyond the rings spent most
  // of its time there). Its events meanwhile are dropped and counted.
  if (t.unclaimed_generation == g_session.generation && (++t.unclaimed_events & 63) != 0)
    return nullptr;
  t.ring = nullptr;
  t.generation = 0;
  t.tid = (uint32_t)syscall(SYS_gettid);
  // (Without /proc, pthread_getattr_np's reallocs must pass through: thread_state.h.)
  uint32_t was = t.in_hook;
  t.in_hook = 1;
  thread_stack_bounds(t);
  t.in_hook = was;
  RingHeader* got = nullptr;
  uint32_t no = 0;
  // Both looks start after the ring the last claim took: the rings before it were taken by
  // threads more likely still alive (a thread pool's, started together), and each ring whose
  // owner lives costs the second look a syscall (23 a claim, 50 threads started at once).
  const uint32_t n = g_nrings;
  const uint32_t from = n ? __atomic_load_n(&g_claim_from, __ATOMIC_RELAXED) % n : 0;
  for (uint32_t k = 0, i = from; k < n && !got; k++, i = (i + 1) % n) {
    RingHeader* r = ring_at(i);
    uint32_t owner = __atomic_load_n(&r->owner, __ATOMIC_RELAXED);
    if ((owner == 0 || owner == t.tid) && try_take(r, owner, t.tid)) got = r, no = i + 1;
  }
  for (uint32_t k = 0, i = from; k < n && !got; k++, i = (i + 1) % n) {
    RingHeader* r = ring_at(i);
    uint32_t owner = __atomic_load_n(&r->owner, __ATOMIC_RELAXED);
    if (syscall(SYS_tgkill, (pid_t)g_ctl->target_pid, (pid_t)owner, 0) != 0 && errno == ESRCH &&
        try_take(r, owner, t.tid))
      got = r, no = i + 1;
  }
  if (got) {
    __atomic_store_n(&g_claim_from, no, __ATOMIC_RELAXED);  // (no: the next ring's index)
    // Fault the ring's first chunk in now, once a session, rather than a page at a time inside
    // the hooks that follow (a ring taken over from a thread that exited is in already); the
    // rest memhook allocates ahead of the writer (consumer/ring_pages.h), and later hooks map
    // it with minor faults. One syscall per claim, never per event: a thread stopped inside a
    // syscall is one GDB may call on. madvise wants a page-aligned start; rings are not (a
    // 128-byte header each).
    if (__atomic_load_n(&g_ring_populated[no - 1], __ATOMIC_RELAXED) != g_session.generation) {
      const uintptr_t lo = (uintptr_t)got & ~uintptr_t(4095);
      const uintptr_t from = (uintptr_t)(got + 1) + (got->write & (g_ring_bytes - 1));
      const uintptr_t hi = min_of<uintptr_t>((uintptr_t)got + ring_stride(g_ring_bytes),
                                             from + kClaimPopulate);
      madvise((void*)lo, hi - lo, MADV_POPULATE_WRITE);
      __atomic_store_n(&g_ring_populated[no - 1], g_session.generation, __ATOMIC_RELAXED);
    }
    t.ring = got;
    t.data = (uint8_t*)(got + 1);
    // The recent stacks were another thread's (or none): forget them. The consumer learns an
    // entry's stack from the record that fills it, in this ring's order. Only those a walk
    // kept: each entry has pages of its own, which the others need not fault in (64 rings'
    // 32 entries were 1,300 of the faults of a program of 400 short threads).
    t.recent = g_recent_stacks + size_t(no - 1) * kRecentStacks * g_recent_stride;
    for (uint32_t kept = g_recent_kept[no - 1]; kept; kept &= kept - 1)
      recent_stack_at(t, __builtin_ctz(kept))->ret0 = 0;  // no call site
    g_recent_kept[no - 1] = 0;
    t.last_recent = recent_stack_at(t, 0);
    t.write = got->write;
    t.cached_read = __atomic_load_n(&got->read, __ATOMIC_ACQUIRE);
    t.fast_until = t.free_until = t.alloc_until = 0;  // the first reserve takes the slow path
    t.woke_at = t.write;
    t.wait_again_at = 0;
    t.credit_at = 0;  // a full credit at the first wait
    t.ring_no = no;
    t.next_time = t.write;  // the first event carries a clock reading
    t.until_check = kCheckEvery;
    t.generation = g_session.generation;  // only a claimed ring makes the fast path valid
    write_marker(t, header(kThread, 0, 0, t.tid), 0, 1);
  } else {
    t.unclaimed_generation = g_session.generation;
    t.unclaimed_events = 0;
  }
  return got;
}

inline void count_no_ring(bool is_free = false) {
  __atomic_fetch_add(&g_ctl->dropped_no_ring, 1, __ATOMIC_RELAXED);
  if (is_free) __atomic_fetch_add(&g_ctl->dropped_frees_no_ring, 1, __ATOMIC_RELAXED);
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

// The common case: this thread's ring is claimed for this session and `bytes` fit at cursor w
// without a look at the consumer, a wrap or a clock reading (reserve_slow sets fast_until and
// free_until).
inline bool fast_room(ThreadState& t, uint64_t w, size_t bytes, bool is_free = false) {
  return __builtin_expect(
      t.generation == g_session.generation && w + bytes <= room_until(t, is_free), 1);
}

}  // namespace
