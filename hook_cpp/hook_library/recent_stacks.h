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

// The entries are sets of kRecentWays: a stack the entry its call picks does not hold may be kept
// in another of its set. A wrapper (xmalloc, zmalloc) called from several places at one depth
// has one return address and one stack pointer for all of them: with one entry each, its callers
// taking turns walked at every call (benchmarks/wrapper_callers.py: 16 B through the wrapper,
// 10.4 ns a call from one caller, 49.4 from two, 55.6 from eight; with sets of 8: 18.6, 29.4;
// sixteen callers still walk, 67.8 ns). The malloc hook by hand compares the entry its call
// picks (and the thread's latest); the others are compared here, after it missed, and a walk
// keeps its stack in an empty one of the set, or else in one the ring's cursor picks.
constexpr uint32_t kRecentWays = 8;
static_assert(kRecentStacks % kRecentWays == 0 && kRecentStacks <= 32);  // (g_recent_kept)

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

// The entries of entry i's set that a walk kept since this ring was claimed (g_recent_kept): the
// others are empty, and are not read (each entry has pages of its own, which a thread that
// never used them need not fault in).
inline uint32_t kept_in_set(const ThreadState& t, uint32_t i) {
  const uint32_t set = i & ~(kRecentWays - 1);
  return g_recent_kept[t.ring_no - 1] & (((uint32_t(1) << (kRecentWays - 1)) * 2 - 1) << set);
}

// The entry of entry i's set, other than i, that holds this call's stack (its index in *k), or
// null.
inline RecentStack* same_stack_in_set(ThreadState& t, uint32_t i, Origin from, uint64_t ret0,
                                      uint32_t* k) {
  for (uint32_t kept = kept_in_set(t, i) & ~(uint32_t(1) << i); kept; kept &= kept - 1) {
    RecentStack* c = recent_stack_at(t, __builtin_ctz(kept));
    if (same_stack(c, from, ret0)) {
      *k = __builtin_ctz(kept);
      return c;
    }
  }
  return nullptr;
}

// Where a walk for entry i's set keeps its stack: entry i if empty, else an empty one of the
// set, else the one the ring's write cursor picks (a stack kept where another was is sent whole:
// the consumer learns it from that record).
inline uint32_t recent_stack_to_fill(const ThreadState& t, uint32_t i) {
  const uint32_t set = i & ~(kRecentWays - 1), kept = kept_in_set(t, i);
  if (!(kept >> i & 1)) return i;
  const uint32_t empty = ~kept & (((uint32_t(1) << (kRecentWays - 1)) * 2 - 1) << set);
  if (empty) return __builtin_ctz(empty);
  return set + (uint32_t(t.write >> 3) & (kRecentWays - 1));
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
