// The backtrace of one allocation: the unwinder (unwinder.h) run from the hook's call site, on
// the stack the hook runs on, and its words kept in the recent stack for the next allocation
// from the same place.
#pragma once

namespace {

// The stack a call at `sp` runs on: this thread's, or the alternate signal stack a handler
// runs on; {0, 0} when neither holds it (a coroutine's stack: nothing above sp is read).
inline StackRegion stack_of(const ThreadState& t, uint64_t sp) {
  if (sp >= t.stack_lo && sp < t.stack_hi) return {sp, t.stack_hi};
  stack_t ss;
  if (syscall(SYS_sigaltstack, nullptr, &ss) == 0 && (ss.ss_flags & SS_ONSTACK) &&
      sp >= (uint64_t)ss.ss_sp && sp < (uint64_t)ss.ss_sp + ss.ss_size)
    return {sp, ((uint64_t)ss.ss_sp + ss.ss_size) & ~uint64_t(7)};
  return {0, 0};
}

// Backtrace from the call site (ret0, the return address at from.ret). Returns the frames
// written to `out`; *caller: the allocating function's frame base (its CFA - 16), or 0. A walk
// the rows alone decided is kept in `c`; any other leaves `c` empty.
inline uint32_t backtrace(ThreadState& t, Origin from, uint64_t ret0, uint64_t* out,
                          uint64_t* caller, RecentStack* c) {
  const uint64_t sp = arch::caller_sp(from);
  const StackRegion region = stack_of(t, sp);
  *caller = 0;
  c->ret0 = 0;
  if (!region.hi) {
    out[0] = ret0;
    return 1;
  }
  const uint64_t index = g_unwind ? __atomic_load_n(&g_unwind->published, __ATOMIC_ACQUIRE) : 0;
  WalkWords w{c->words, 0, kWordsPerFrame * g_depth, 0, true, region.hi == t.stack_hi};
  uint64_t cfa1;
  uint64_t* const o = unwind(ret0, sp, (uint64_t)from.frame, region, {t.stack_lo, t.stack_hi},
                             out, out + g_depth, &cfa1, w);
  if (cfa1) *caller = cfa1 - 16;
  if (!w.keep || w.n > w.cap) return uint32_t(o - out);
  // Pairs first (the leading frame-pointer frames), then the other words one by one, but for
  // saved rbp values no frame used.
  w.forget_unused_bp();
  const uint32_t npairs = w.pairs;
  uint32_t n = 2 * npairs;
  for (uint32_t i = 0; i < n; i++) c->words[i].addr &= ~WalkWords::kUnused;  // compared as pairs
  for (uint32_t i = n; i < w.n; i++)
    if (!(c->words[i].addr & WalkWords::kUnused)) c->words[n++] = c->words[i];
  [[maybe_unused]] const uint32_t nsteps = n - 2 * npairs;  // (the hand-written entry's)
  c->frame = (uint64_t)from.frame;
  c->sp = (uint64_t)from.ret;
  c->nwords = n;
  c->frame_used = w.entry_bp_used;
#if MEMHOOK_MALLOC_ENTRY
  if (npairs <= kAlignedPairs && nsteps <= kAlignedSteps) {
    for (uint32_t i = 0; i < npairs; i++)
      c->pairs[kAlignedPairs - npairs + i] = {c->words[2 * i].value, c->words[2 * i + 1].value};
    for (uint32_t i = 0; i < nsteps; i++)
      c->steps[kAlignedSteps - nsteps + i] = c->words[2 * npairs + i];
    c->pairs_compare = pairs_entry(npairs);
    c->compare = nsteps ? steps_entry(nsteps) : c->pairs_compare;
  } else {
    c->compare = (uint64_t)memhook_compare_miss;
  }
  // In a Python process an entry also holds Python frames, which the malloc hook by hand does
  // not read: it leaves every entry to the compiled path (records.h: python_stack_words).
  if (g_python) c->compare = (uint64_t)memhook_compare_miss;
#endif
  // (Marked kept before it is: a claim empties the entries marked.)
  g_recent_kept[t.ring_no - 1] |= 1u << (uint32_t((uint8_t*)c - t.recent) / g_recent_stride);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);  // a handler's hook sees the entry whole or empty
  c->ret0 = ret0;
  // Rows published during the walk: memhook may have emptied the entries before this one was
  // kept (Consumer::forget_recent_stacks), so this one empties itself.
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (g_unwind && __atomic_load_n(&g_unwind->published, __ATOMIC_ACQUIRE) != index) c->ret0 = 0;
  return uint32_t(o - out);
}

}  // namespace
