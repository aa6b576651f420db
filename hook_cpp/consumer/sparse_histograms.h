// Each stack's log2 histograms (sizes, lifetimes), kept sparse: most stacks' blocks fall into a
// few buckets (one size, a few lifetimes). A Python program's 200,000 stacks with three dense
// 48-bucket rows each were 280 MB of fresh pages, which the kernel zeroed for the consumer during
// the burst that made the stacks: three quarters of the consumer's time while `memhook run`
// traced an import of numpy and matplotlib, and the target's rings overflowed meanwhile. A stack
// holds up to kInline (bucket, count) pairs in place (32 bytes a histogram); a bucket more moves
// them into a dense row of its own.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <vector>

#include "grown_array.h"

namespace memhook {

constexpr int kBuckets = 48;  // log2 histograms: bucket b holds values in [2^b, 2^(b+1))

class SparseHistograms {
 public:
  static constexpr int kInline = 4;

  // Rows for stack ids below `stacks` (new ones empty).
  void resize(size_t stacks) { inline_.resize(stacks); }
  size_t size() const { return inline_.size(); }

  void add(size_t stack, int bucket) {
    uint64_t* s = inline_[stack].slot;
    if ((s[0] & kBucketMask) == kSpilled) {
      rows_[(s[0] >> kCountShift) * kBuckets + bucket]++;
      return;
    }
    // Slots fill in order and never empty: the first empty one means no later one matches.
    for (int i = 0; i < kInline; i++) {
      if (!s[i]) {
        s[i] = kOne | uint64_t(bucket);
        return;
      }
      if ((s[i] & kBucketMask) == uint64_t(bucket)) {
        s[i] += kOne;
        return;
      }
    }
    spill(s, bucket);
  }

  // Every non-zero count of rows 0..n-1 as (row * kBuckets + bucket, count), row by row: a
  // capture's BEHV block holds them so (a Python program's 349,000 rows were 540 MB dense).
  void sparse(size_t n, std::vector<uint64_t>& at, std::vector<uint64_t>& count) const {
    for (size_t k = 0; k < n && k < inline_.size(); k++) {
      const uint64_t* s = inline_[k].slot;
      if ((s[0] & kBucketMask) == kSpilled) {
        const uint64_t* row = &rows_[(s[0] >> kCountShift) * kBuckets];
        for (int b = 0; b < kBuckets; b++)
          if (row[b]) at.push_back(k * kBuckets + b), count.push_back(row[b]);
        continue;
      }
      for (int i = 0; i < kInline && s[i]; i++)
        at.push_back(k * kBuckets + (s[i] & kBucketMask)), count.push_back(s[i] >> kCountShift);
    }
  }

  size_t spilled() const { return rows_.size() / kBuckets; }

 private:
  // A slot: count << kCountShift | bucket, 0 when empty (a count is at least 1). A stack whose
  // buckets outgrew its slots has kSpilled as slot 0's bucket and its row's index as the count.
  static constexpr int kCountShift = 6;
  static constexpr uint64_t kBucketMask = (1 << kCountShift) - 1, kOne = 1 << kCountShift;
  static constexpr uint64_t kSpilled = kBucketMask;  // (no bucket: there are 48)
  static_assert(kBuckets <= int(kSpilled), "a bucket must fit beside the mark");
  struct Inline {
    uint64_t slot[kInline];
  };

  __attribute__((noinline)) void spill(uint64_t* s, int bucket) {
    const size_t row = rows_.size() / kBuckets;
    rows_.resize(rows_.size() + kBuckets);
    uint64_t* dense = &rows_[row * kBuckets];
    for (int i = 0; i < kInline; i++) dense[s[i] & kBucketMask] = s[i] >> kCountShift;
    dense[bucket]++;
    s[0] = (uint64_t(row) << kCountShift) | kSpilled;
    for (int i = 1; i < kInline; i++) s[i] = 0;
  }

  GrownArray<Inline> inline_;
  GrownArray<uint64_t> rows_;  // kBuckets per spilled stack, in the order they spilled
};

}  // namespace memhook
