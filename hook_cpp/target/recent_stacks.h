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
struct Origin {
  void** ret;
  void** frame;
};
inline Origin origin_of(void** fp) { return {fp + 1, (void**)fp[0]}; }

// The recent stack a call from `from` uses: its return address and stack pointer pick it, so that a
// wrapper (one call site, many stacks) called from different depths uses different entries.
inline RecentStack* recent_stack_for(ThreadState& t, uint64_t ret0, Origin from, uint32_t* i) {
  constexpr int bits = __builtin_ctz(kRecentStacks);
  *i = uint32_t(uint32_t(ret0 ^ (uint64_t)from.ret) * kGolden32) >> (32 - bits);
  return recent_stack_at(t, *i);
}

// Would backtrace() from `from` yield the stack `c` holds? The same key, then the 2n words that
// walk read, compared 16 bytes at a time at the addresses the entry recorded: no load waits for
// another, where the walk follows a chain. Every address read lies between the caller's frame
// and the top of this thread's stack (the walk that filled the entry checked them, on this
// thread: claim_ring empties them), so nothing read can fault.
inline bool same_stack(const RecentStack* c, Origin from, uint64_t ret0) {
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

// memhook_hook_malloc compares a recent stack's pairs in an unrolled sequence of kAlignedPairs steps,
// step j comparing pairs[j] (RecentStack): one of n pairs enters it at step kAlignedPairs - n
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

}  // namespace
