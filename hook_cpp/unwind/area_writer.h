// memhook's side of the segment's unwind area (unwind_rows.h): rows are appended, then a new
// index of every object is written and published in one 8-byte store. Nothing written is ever
// changed, so a hook reading an older index reads rows that are still there.
#pragma once
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "unwind_rows.h"

namespace memhook {

// Appends `n` rows; returns the first's index (in the area's 8-byte units).
inline uint32_t unwind_add_rows(UnwindArea* a, const Row* rows, size_t n) {
  if (!a) throw std::runtime_error("the segment has no unwind area");
  const uint64_t at = a->used, bytes = n * sizeof(Row);
  if (bytes > a->capacity - at) throw std::length_error("the unwind area is full");
  memcpy((uint8_t*)a + at, rows, bytes);
  a->used = at + bytes;
  return uint32_t(at / sizeof(Row));
}

// Publishes `objects` (sorted here by lo) as the index the hooks use from now on.
inline void unwind_publish(UnwindArea* a, std::vector<UnwindObject> objects) {
  if (!a) throw std::runtime_error("the segment has no unwind area");
  std::sort(objects.begin(), objects.end(),
            [](const UnwindObject& x, const UnwindObject& y) { return x.lo < y.lo; });
  const uint64_t at = (a->used + 63) & ~uint64_t(63), bytes = objects.size() * sizeof(UnwindObject);
  if (at > a->capacity || bytes > a->capacity - at || at > UINT32_MAX)
    throw std::length_error("the unwind area is full");
  for (const UnwindObject& o : objects)
    if (o.lo >= o.hi || uint64_t(o.first) + o.nrows > at / sizeof(Row) || !o.nrows)
      throw std::invalid_argument("unwind object outside the rows written");
  memcpy((uint8_t*)a + at, objects.data(), bytes);
  a->used = at + bytes;
  __atomic_store_n(&a->published, unwind_index_word(at, uint32_t(objects.size())),
                   __ATOMIC_RELEASE);
}

}  // namespace memhook
