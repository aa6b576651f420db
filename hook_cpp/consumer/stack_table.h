// Unique call stacks: each distinct sequence of return addresses gets a stack id (1, 2, ...; 0
// is none), its frames kept once, in order of first sight.
#pragma once
#include <stddef.h>
#include <stdint.h>

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
  size_t end(size_t id) const {  // (past its last frame)
    return id + 1 < stacks_.size() ? stacks_[id + 1].offset : frames_.size();
  }
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
    Slot* slot = &slot_of(h);
    for (uint32_t id = slot->id; id; id = next_[id]) {
      const Stack& s = stacks_[id];
      if (s.count == n && same_frames(f, frames_.data() + s.offset, n)) return id;
    }
    const uint32_t id = (uint32_t)stacks_.size();
    stacks_.push_back({frames_.size(), n});
    frames_.append(f, n);
    next_.push_back(slot->id);  // (the stacks before it with this hash: 0, nearly always)
    if (!slot->id) {
      if ((hashes_ + 1) * 2 > slots_.size()) {
        grow();
        slot = &slot_of(h);
      }
      hashes_++;
    }
    *slot = Slot{h, id};
    return id;
  }

  // The stacks by hash: open addressing, linear probing (a new stack's lookup is one cache miss
  // instead of std::unordered_map's bucket and node, and an insert allocates nothing: a Python
  // program's import made 205,000 new stacks, each a node). Each slot holds the latest stack of
  // its hash, next_ the ones before it. Id 0 marks an empty slot.
  struct Slot {
    uint64_t hash;
    uint32_t id;
  };
  Slot& slot_of(uint64_t h) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask)  // (h is mixed: its low bits will do)
      if (!slots_[i].id || slots_[i].hash == h) return slots_[i];
  }
  void grow() {
    const std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{0, 0});
    for (const Slot& s : old)
      if (s.id) slot_of(s.hash) = s;
  }

  std::vector<Stack> stacks_;
  std::vector<uint32_t> next_;  // next stack id with the same hash
  GrownArray<uint64_t> frames_;  // every stack's, in order
  std::vector<Slot> slots_ = std::vector<Slot>(size_t(1) << 16, Slot{0, 0});
  size_t hashes_ = 0;  // slots in use
  static constexpr size_t kRecent = 4096;
  std::vector<std::pair<uint64_t, uint32_t>> recent_ =
      std::vector<std::pair<uint64_t, uint32_t>>(kRecent, {0, 0});
};

}  // namespace memhook
