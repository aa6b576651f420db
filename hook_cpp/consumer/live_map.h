// The blocks live now, by address: open addressing, linear probing, backward-shift deletion (no
// tombstones). Addresses are never 0, so key 0 marks an empty entry.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include <new>

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
  ~LiveMap() { unmap(table_); }
  LiveMap(const LiveMap&) = delete;
  LiveMap& operator=(const LiveMap&) = delete;

  Block* find(uint64_t key) {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (blocks_[i].key == key) return &blocks_[i];
      if (!blocks_[i].key) return nullptr;
    }
  }
  const Block* find(uint64_t key) const { return const_cast<LiveMap*>(this)->find(key); }

  // Start loading the entry `key` would be found at first (ring_reader.h: prefetch_ahead).
  void prefetch(uint64_t key) const { __builtin_prefetch(&blocks_[hash(key) & mask_]); }

  // The entry for `key`, created empty (size 0, stack 0) if absent; `inserted` tells which.
  Block* insert(uint64_t key, bool* inserted) {
    if ((count_ + 1) * 2 > mask_ + 1) resize((mask_ + 1) * 2);
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
    size_t i = b - blocks_;
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
  struct Entries {
    const Block *b, *e;
    const Block* begin() const { return b; }
    const Block* end() const { return e; }
  };
  Entries entries() const { return {blocks_, blocks_ + mask_ + 1}; }

 private:
  // Fibonacci hashing: every bit of the address moves the entry. Keeping neighbouring blocks
  // in neighbouring entries (an earlier hash) saved nothing (an entry is most of a cache line)
  // and cost everything under pymalloc: its pools are dense runs of equal blocks, whose entries
  // merged into clusters thousands long that every absent key's probe and every erase crossed
  // (benchmarks/python_frames.py: 80 % of the consumer's time).
  size_t hash(uint64_t k) const { return (size_t)(((k >> 4) * 0x9E3779B97F4A7C15ull) >> shift_); }

  // The table is mapped, not allocated: it comes zeroed (key 0: empty) without a pass over it,
  // and in huge pages where the kernel has them, since every lookup lands somewhere random in
  // it and would otherwise miss the TLB as well as the caches.
  struct Table {
    void* map = nullptr;
    size_t len = 0;
  };
  static constexpr size_t kHuge = 2 << 20;
  static Table map_table(size_t n, Block** blocks) {
    Table t;
    t.len = n * sizeof(Block) + kHuge;
    t.map = mmap(nullptr, t.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t.map == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t start = ((uintptr_t)t.map + kHuge - 1) & ~(kHuge - 1);
    madvise((void*)start, (uintptr_t)t.map + t.len - start, MADV_HUGEPAGE);  // a hint
    *blocks = n * sizeof(Block) >= kHuge ? (Block*)start : (Block*)t.map;
    return t;
  }
  static void unmap(const Table& t) {
    if (t.map) munmap(t.map, t.len);
  }

  void resize(size_t n) {
    Block* old = blocks_;
    const size_t old_n = old ? mask_ + 1 : 0;
    const Table old_table = table_;
    table_ = map_table(n, &blocks_);
    mask_ = n - 1;
    shift_ = 64 - __builtin_ctzll(n);
    count_ = 0;
    bool inserted;
    for (size_t i = 0; i < old_n; i++)
      if (old[i].key) *insert(old[i].key, &inserted) = old[i];
    unmap(old_table);
  }

  Block* blocks_ = nullptr;
  Table table_;
  size_t mask_ = 0, count_ = 0;
  int shift_ = 64;
};

}  // namespace memhook
