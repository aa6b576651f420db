// The blocks live now, by address: open addressing, linear probing, backward-shift deletion (no
// tombstones). Addresses are never 0, so key 0 marks an empty entry.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace memhook {

class LiveMap {
 public:
  struct Block {
    uint64_t key;
    uint64_t size;
    uint64_t ts;  // when it was allocated (raw clock)
    uint64_t uncertainty;  // how far ts may be off (raw clock)
    uint32_t stack;
    uint32_t tid;  // which thread allocated it
    uint32_t call_index, call_seq;  // its allocating call in the thread's active frames
    uint64_t event;  // its allocation, named as a dependency would name it
  };

  LiveMap() { resize(1 << 16); }

  Block* find(uint64_t key) {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (blocks_[i].key == key) return &blocks_[i];
      if (!blocks_[i].key) return nullptr;
    }
  }
  const Block* find(uint64_t key) const { return const_cast<LiveMap*>(this)->find(key); }

  // The entry for `key`, created empty (size 0, stack 0) if absent; `inserted` tells which.
  Block* insert(uint64_t key, bool* inserted) {
    if ((count_ + 1) * 2 > blocks_.size()) resize(blocks_.size() * 2);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (blocks_[i].key == key) {
        *inserted = false;
        return &blocks_[i];
      }
      if (!blocks_[i].key) {
        blocks_[i] = Block{key, 0, 0, 0, 0, 0, 0, 0, 0};
        count_++;
        *inserted = true;
        return &blocks_[i];
      }
    }
  }

  void erase(Block* b) {
    size_t i = b - blocks_.data();
    for (size_t j = (i + 1) & mask_; blocks_[j].key; j = (j + 1) & mask_) {
      size_t home = hash(blocks_[j].key) & mask_;
      // Entry j may move back to i unless its home lies cyclically in (i, j].
      bool stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        blocks_[i] = blocks_[j];
        i = j;
      }
    }
    blocks_[i].key = 0;
    count_--;
  }

  size_t size() const { return count_; }
  // Every entry, empty ones (key 0) included.
  const std::vector<Block>& entries() const { return blocks_; }

 private:
  // Neighbouring blocks get neighbouring entries (allocators hand out runs of adjacent blocks,
  // and their entries then share cache lines); each 1 MiB window of addresses starts at its own
  // random offset, so windows at round distances (arenas, mmaps) do not pile up.
  static size_t hash(uint64_t k) {
    return (size_t)((k >> 4) ^ ((k >> 20) * 0x9E3779B97F4A7C15ull >> 24));
  }

  void resize(size_t n) {
    std::vector<Block> old;
    old.swap(blocks_);
    blocks_.assign(n, Block{0, 0, 0, 0, 0, 0, 0, 0, 0});
    mask_ = n - 1;
    count_ = 0;
    bool inserted;
    for (const Block& b : old)
      if (b.key) *insert(b.key, &inserted) = b;
  }

  std::vector<Block> blocks_;
  size_t mask_ = 0, count_ = 0;
};

}  // namespace memhook
