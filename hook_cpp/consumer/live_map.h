// The blocks live now, by address: open addressing, linear probing, backward-shift deletion (no
// tombstones), grown a few entries at a time. Addresses are never 0, so key 0 marks an empty entry.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include <algorithm>
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

  LiveMap() { cur_ = make_table(1 << 16); }
  ~LiveMap() {
    unmap(cur_);
    unmap(old_);
    unmap(next_);
  }
  LiveMap(const LiveMap&) = delete;
  LiveMap& operator=(const LiveMap&) = delete;

  Block* find(uint64_t key) {
    if (Block* b = find_in(cur_, key)) return b;
    return old_.blocks ? find_in(old_, key) : nullptr;
  }
  const Block* find(uint64_t key) const { return const_cast<LiveMap*>(this)->find(key); }

  // Start loading the entry `key` would be found at first (ring_reader.h: prefetch_ahead).
  void prefetch(uint64_t key) const {
    __builtin_prefetch(&cur_.blocks[home(cur_, key)]);
    if (old_.blocks) __builtin_prefetch(&old_.blocks[home(old_, key)]);  // an absent key's too
  }

  // The entry for `key`, created empty (size 0, stack 0) if absent; `inserted` tells which.
  // A key lives in one table: new keys go into the current one, a key still in the old one is
  // found there.
  Block* insert(uint64_t key, bool* inserted) {
    move_some(kMovesPerInsert);
    touch_some();
    if (past_load(count_ + 1, cur_.mask + 1)) grow();
    size_t i = home(cur_, key);
    for (;; i = (i + 1) & cur_.mask) {
      if (cur_.blocks[i].key == key) {
        *inserted = false;
        return &cur_.blocks[i];
      }
      if (!cur_.blocks[i].key) break;
    }
    if (old_.blocks) {
      if (Block* b = find_in(old_, key)) {
        *inserted = false;
        return b;
      }
    }
    cur_.blocks[i] = Block{key, 0, 0, 0, 0, 0, 0, 0, 0};
    count_++;
    *inserted = true;
    return &cur_.blocks[i];
  }

  void erase(Block* b) {
    Table& t = old_.blocks && b >= old_.blocks && b <= old_.blocks + old_.mask ? old_ : cur_;
    erase_in(t, size_t(b - t.blocks));
    count_--;
  }

  size_t size() const { return count_; }
  // Every entry of both tables, empty ones (key 0) included.
  struct Entries {
    const Block *b, *e, *b2, *e2;
    struct It {
      const Block *p, *e, *b2, *e2;
      const Block& operator*() const { return *p; }
      It& operator++() {
        if (++p == e && b2) {
          p = b2;
          e = e2;
          b2 = nullptr;
        }
        return *this;
      }
      bool operator!=(const It& o) const { return p != o.p; }
    };
    It begin() const { return It{b, e, b2, e2}; }  // (the current table is never empty)
    It end() const { return It{b2 ? e2 : e, nullptr, nullptr, nullptr}; }
  };
  Entries entries() const {
    const Block* ob = old_.blocks;
    return {cur_.blocks, cur_.blocks + cur_.mask + 1, ob, ob ? ob + old_.mask + 1 : nullptr};
  }

 private:
  // The table is mapped, not allocated: it comes zeroed (key 0: empty) without a pass over it,
  // and in huge pages where the kernel has them, since every lookup lands somewhere random in
  // it and would otherwise miss the TLB as well as the caches.
  struct Table {
    Block* blocks = nullptr;
    size_t mask = 0;
    int shift = 64;
    void* map = nullptr;
    size_t len = 0;
  };
  static constexpr size_t kHuge = 2 << 20;
  // A table is kept at most 7/10 full. At half full, as before, a server's 280 k live blocks took a
  // table of 1 M entries (56 MiB, and 28 more while the last one's entries moved): memhook's peak
  // RSS 153-156 MiB under redis-benchmark, 127 MiB at 7/10, with the consumer no slower per event
  // (benchmarks/redis_consumer.py, alternated: 60.0 and 66.6 ns against 66.6 and 73.9; a Python
  // import's 3 M events, python_import.py: 0.65-0.68 s of consumer CPU against 0.63-0.93, 508 MiB
  // against 539).
  static constexpr size_t kLoadNum = 7, kLoadDen = 10;
  static bool past_load(size_t count, size_t cap) { return count * kLoadDen > cap * kLoadNum; }
  static Table make_table(size_t n) {
    Table t;
    t.len = n * sizeof(Block) + kHuge;
    t.map = mmap(nullptr, t.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t.map == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t start = ((uintptr_t)t.map + kHuge - 1) & ~(kHuge - 1);
    madvise((void*)start, (uintptr_t)t.map + t.len - start, MADV_HUGEPAGE);  // a hint
    t.blocks = n * sizeof(Block) >= kHuge ? (Block*)start : (Block*)t.map;
    t.mask = n - 1;
    t.shift = 64 - __builtin_ctzll(n);
    return t;
  }
  static void unmap(Table& t) {
    if (t.map) munmap(t.map, t.len);
    t = Table{};
  }

  // Fibonacci hashing: every bit of the address moves the entry. Keeping neighbouring blocks
  // in neighbouring entries (an earlier hash) saved nothing (an entry is most of a cache line)
  // and cost everything under pymalloc: its pools are dense runs of equal blocks, whose entries
  // merged into clusters thousands long that every absent key's probe and every erase crossed
  // (benchmarks/python_frames.py: 80 % of the consumer's time).
  static size_t home(const Table& t, uint64_t k) {
    return (size_t)(((k >> 4) * 0x9E3779B97F4A7C15ull) >> t.shift) & t.mask;
  }

  static Block* find_in(const Table& t, uint64_t key) {
    for (size_t i = home(t, key);; i = (i + 1) & t.mask) {
      if (t.blocks[i].key == key) return &t.blocks[i];
      if (!t.blocks[i].key) return nullptr;
    }
  }

  // Backward-shift deletion: the entries after the hole that may move back into it do, so
  // every entry stays reachable from its home without crossing an empty one.
  static void erase_in(Table& t, size_t i) {
    for (size_t j = (i + 1) & t.mask; t.blocks[j].key; j = (j + 1) & t.mask) {
      size_t h = home(t, t.blocks[j].key);
      // Entry j may move back to i unless its home lies cyclically in (i, j].
      bool stays = (i <= j) ? (h > i && h <= j) : (h > i || h <= j);
      if (!stays) {
        t.blocks[i] = t.blocks[j];
        i = j;
      }
    }
    t.blocks[i].key = 0;
  }

  // Growth moves the entries a few at a time, with the inserts that follow, not all at once:
  // moving a million of them held the consumer for 0.2 s, longer than a writer with a full
  // ring waits, so a burst of kept blocks lost a third of its events (benchmarks/lossless.py).
  // The old table's slots are moved in order; a moved entry is erased from it as any other, so
  // the old table stays a valid table for lookups, and its slots below moved_ stay empty (a
  // backward shift only moves an entry back to the hole, which is at or above moved_).
  // The next growth comes after at least 7/10 of the old table's size in inserts; moving 4
  // slots each empties the old table after a quarter of it.
  static constexpr int kMovesPerInsert = 4;
  static constexpr size_t kMoveAhead = 8;

  void grow() {
    move_some(SIZE_MAX);  // (not reached while the inserts keep up, as above)
    if (!next_.blocks) next_ = make_table((cur_.mask + 1) * 2);
    touch(next_.len);  // (the rest, where the inserts came faster than the touches)
    old_ = cur_;
    cur_ = next_;
    next_ = Table{};
    moved_ = 0;
  }

  // The next table's pages are written before it is needed, a few with each insert in the cap/16
  // before growth, so that its page faults (the kernel zeroing 2 MiB for each huge page) are spread
  // over the inserts: taken all at once by the first inserts after growth, they held the consumer
  // for more than a full ring's writer waits (10 ms: benchmarks/lossless.py's kept burst dropped
  // half its events). A heap that stops growing there holds a table it does not use, up to twice
  // the current one.
  void touch_some() {
    const size_t cap = cur_.mask + 1;
    if (!next_.blocks) {
      if (!past_load(count_ + cap / 16, cap)) return;
      next_ = make_table(cap * 2);
      touched_ = 0;
      touch_per_insert_ = next_.len / (cap / 16) + 1;
    }
    touch(touch_per_insert_);
  }

  void touch(size_t bytes) {
    const size_t end = std::min(next_.len, touched_ + bytes);
    for (size_t at = (touched_ + 4095) & ~size_t(4095); at < end; at += 4096)
      ((volatile char*)next_.map)[at] = 0;  // a write: a read would map the shared zero page
    touched_ = end;
  }

  void move_some(size_t budget) {
    for (; old_.blocks && budget; budget--) {
      if (moved_ > old_.mask) {
        unmap(old_);
        return;
      }
      Block& b = old_.blocks[moved_];
      if (!b.key) {
        moved_++;
        continue;
      }
      // The new home of an entry a few slots on, fetched while this one moves.
      if (const uint64_t ahead = old_.blocks[(moved_ + kMoveAhead) & old_.mask].key)
        __builtin_prefetch(&cur_.blocks[home(cur_, ahead)], 1);
      size_t i = home(cur_, b.key);
      while (cur_.blocks[i].key) i = (i + 1) & cur_.mask;
      cur_.blocks[i] = b;
      erase_in(old_, moved_);  // may bring a later entry into this slot: looked at next
    }
  }

  Table cur_, old_;  // old_: the table being moved from (blocks null when none)
  Table next_;  // the table the next growth moves to, while its pages are touched
  size_t touched_ = 0, touch_per_insert_ = 0;  // next_'s bytes touched; how many per insert
  size_t moved_ = 0;  // old_'s slots below this are empty
  size_t count_ = 0;  // in both
};

}  // namespace memhook
