// The address table: for each pointer, its latest event, so that the next event on that pointer
// (on any thread) carries it as a dependency (segment.h explains the ordering).
#pragma once

// The address table (segment.h): the hooks' own, so here rather than in the shared segment, where
// the malloc hook addresses it relative to its own code instead of loading a pointer. Pages are
// touched on demand; memhook_start empties it.
// Global (hidden): malloc_entry.S reads it.
alignas(4096) uint64_t g_table[uint64_t(1) << kTableBits] asm("memhook_table");

namespace {

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

// An event the ring had no room for: the pointer's entry says live or not all the same, keeping
// its dependency (a later event on the pointer still waits for the one the consumer knows). A
// dropped free marks it freed, and at detach memhook reads the table and drops the block from the
// report (Consumer::reconcile); a realloc whose unrecorded free failed marks it live again. An
// entry another pointer has taken since is left alone: that block is reported as uncertain.
inline void table_set_live(uint64_t p, bool live) {
  TableIndex ti = table_index(p);
  uint64_t* e = g_table + ti.index;
  uint64_t old = __atomic_load_n(e, __ATOMIC_RELAXED);
  if ((old & kTagMask) == (ti.tag & kTagMask))
    __atomic_store_n(e, live ? old | kLive : old & ~kLive, __ATOMIC_RELAXED);
}

}  // namespace
