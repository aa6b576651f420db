// Which entry of the hook library a slot is pointed at: one table for memhook (patching at
// attach, through _native.entry_symbol) and for the hook library (patching libraries loaded
// later, in memhook_start). Sampling sessions enter allocations through a countdown and frees
// through a look at the filter of sampled blocks, which skip the recording part when there is
// nothing to record; size-filter sessions enter allocations where the filter is applied; every
// other slot gets the entry that records every call.
#pragma once
#include <stdint.h>

namespace memhook {

enum Entry : int { kEntryEvery = 0, kEntryFilter = 1, kEntrySample = 2 };
constexpr const char* kEntryPrefix[] = {"memhook_hook_", "memhook_filter_", "memhook_sample_"};

// kind: a hooks.def row's ('A' ALLOC, 'F' FREE, 'R' REALLOC, 'L' LOADER, 'P' PROCESS...).
constexpr Entry entry_for(char kind, uint64_t sample_rate, bool size_filter) {
  if (sample_rate && (kind == 'A' || kind == 'F')) return kEntrySample;
  if (!sample_rate && size_filter && kind == 'A') return kEntryFilter;
  return kEntryEvery;
}

}  // namespace memhook
