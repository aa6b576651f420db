// Recent stacks: each ring keeps kRecentStacks stacks on the writer's side (RecentStack,
// segment.h), so that an allocation from a stack seen before is recognised by comparing the
// words its walk read, without walking again.
#pragma once

namespace {

// Recent stack `i` of this thread's ring (RecentStack, segment.h).
inline RecentStack* recent_stack_at(ThreadState& t, uint32_t i) {
  return (RecentStack*)(t.recent + i * g_recent_stride);
}

// Where a hook was called from: the recent stack holding its return address (the allocation's
// call site) and the caller's frame pointer. A compiled hook finds both in its own frame; the
// assembly entry (memhook_hook_malloc) has none and passes them as it found them.
// (The processor's: arch/<arch>/hook_frame.h.)
using arch::HookFrame;
using arch::Origin;
using arch::origin_of;

// The recent stack a call from `from` uses: its return address and stack pointer pick it, so that a
// wrapper (one call site, many stacks) called from different depths uses different entries.
inline RecentStack* recent_stack_for(ThreadState& t, uint64_t ret0, Origin from, uint32_t* i) {
  constexpr int bits = __builtin_ctz(kRecentStacks);
  *i = uint32_t(uint32_t(ret0 ^ (uint64_t)from.ret) * kGolden32) >> (32 - bits);
  return recent_stack_at(t, *i);
}

// Would backtrace() from `from` yield the stack `c` holds? The same key, then the words that
// walk read, each compared at the address it was read from: no load waits for another, where
// the walk follows a chain. Every address lies between the stack pointer of that call, which is
// this call's, and the top of this thread's stack (the walk that filled the entry checked them,
// on this thread: claim_ring empties them), so nothing read can fault.
inline bool same_stack(const RecentStack* c, Origin from, uint64_t ret0) {
  if (c->ret0 != ret0 || c->sp != (uint64_t)from.ret ||
      (c->frame != (uint64_t)from.frame && c->frame_used))
    return false;
  uint64_t diff = 0;
  for (uint32_t i = 0; i < c->nwords; i++)
    diff |= *(const uint64_t*)c->words[i].addr ^ c->words[i].value;
  return diff == 0;
}

#if MEMHOOK_MALLOC_ENTRY
// memhook_hook_malloc compares a recent stack in two unrolled sequences (segment.h): words,
// step j comparing steps[j], one of m words entering at step kAlignedSteps - m; then pairs,
// step j comparing pairs[j], one of n pairs entering at step kAlignedPairs - n (on x86-64 with
// AVX-512 or SSE4.1: arch::pair_steps), ending at memhook_compare_done (the record). Every word
// step has the same size, and every pair step but the last.
extern "C" const char memhook_compare_words[], memhook_compare_words_end[],
    memhook_compare_done[], memhook_compare_miss[];
const char* g_compare_first;  // the pair sequence this CPU runs (memhook_start)
const char* g_compare_last;
inline uint64_t pairs_entry(uint32_t n) {
  if (!n) return (uint64_t)memhook_compare_done;
  const uint64_t step = (g_compare_last - g_compare_first) / (kAlignedPairs - 1);
  return (uint64_t)g_compare_first + (kAlignedPairs - n) * step;
}
inline uint64_t steps_entry(uint32_t m) {
  const uint64_t step = (memhook_compare_words_end - memhook_compare_words) / kAlignedSteps;
  return (uint64_t)memhook_compare_words + (kAlignedSteps - m) * step;
}
#endif

}  // namespace
