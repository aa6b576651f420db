// Unique call stacks: each distinct sequence of return addresses gets a stack id (1, 2, ...; 0
// is none), its frames kept once, in order of first sight.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <unordered_map>
#include <utility>
#include <vector>

#include "grown_array.h"

namespace memhook {

class StackTable {
 public:
  StackTable() {
    stacks_.push_back({0, 0});  // stack id 0: none
    next_.push_back(0);
  }

  // The id of the stack `f[0..n)`, a new one if it was never seen.
  uint32_t intern(const uint64_t* f, uint32_t n) {
    uint64_t h = hash_frames(f, n);
    // Most events repeat a recent stack: a direct-mapped cache in front of the map.
    auto& hot = recent_[h & (kRecent - 1)];
    if (hot.first == h) {
      const Stack& s = stacks_[hot.second];
      if (s.count == n && same_frames(f, frames_.data() + s.offset, n)) return hot.second;
    }
    uint32_t found = find(h, f, n);
    hot = {h, found};
    return found;
  }

  size_t size() const { return stacks_.size(); }  // ids in use, 0 included
  size_t offset(size_t id) const { return stacks_[id].offset; }  // into frames()
  const GrownArray<uint64_t>& frames() const { return frames_; }

 private:
  struct Stack {
    size_t offset;  // into frames_
    uint32_t count;
  };

  // One multiply per frame, off the chain that carries the hash from frame to frame.
  static uint64_t hash_frames(const uint64_t* f, uint32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (uint32_t i = 0; i < n; i++) h = ((h << 7) | (h >> 57)) ^ (f[i] * 0xff51afd7ed558ccdull);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
  }

  static bool same_frames(const uint64_t* a, const uint64_t* b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
      if (a[i] != b[i]) return false;
    return true;
  }

  uint32_t find(uint64_t h, const uint64_t* f, uint32_t n) {
    auto it = by_hash_.find(h);
    uint32_t id = it == by_hash_.end() ? 0 : it->second;
    for (; id; id = next_[id]) {
      const Stack& s = stacks_[id];
      if (s.count == n && same_frames(f, frames_.data() + s.offset, n)) return id;
    }
    id = (uint32_t)stacks_.size();
    stacks_.push_back({frames_.size(), n});
    frames_.append(f, n);
    next_.push_back(it == by_hash_.end() ? 0 : it->second);
    by_hash_[h] = id;
    return id;
  }

  std::vector<Stack> stacks_;
  std::vector<uint32_t> next_;  // next stack id with the same hash
  GrownArray<uint64_t> frames_;  // every stack's, in order
  std::unordered_map<uint64_t, uint32_t> by_hash_;
  static constexpr size_t kRecent = 4096;
  std::vector<std::pair<uint64_t, uint32_t>> recent_ =
      std::vector<std::pair<uint64_t, uint32_t>>(kRecent, {0, 0});
};

}  // namespace memhook
