// glibc malloc's structures as each version lays them out (malloc/malloc.c, malloc/arena.c),
// and where they are in a running process that has no debug symbols: main_arena is found in
// libc's writable data by what it must hold (a `next` ring of arenas that comes back to it, a
// `top` chunk that ends the [heap]), and every other arena by following that ring.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "target_memory.h"

namespace memhook::census {

constexpr uint64_t kSizeSz = 8, kMinSize = 32, kAlign = 16;
constexpr uint64_t kPrevInuse = 1, kIsMmapped = 2, kNonMainArena = 4, kFlags = 7;
constexpr uint64_t kHeapMax = 64ull << 20;  // HEAP_MAX_SIZE on 64-bit: arena heaps align to it
constexpr int kFastbins = 10;                // NFASTBINS on 64-bit
constexpr int kTcacheBins = 64;

inline uint64_t chunk_size(uint64_t size_field) { return size_field & ~kFlags; }

struct MallocLayout {
  int minor = 0;                  // glibc 2.<minor>
  uint64_t fastbins = 0, top = 0, next = 0, system_mem = 0, state_bytes = 0;
  bool tcache = false;            // 2.26: per-thread caches
  bool tcache_u16 = false;        // 2.30: counts are uint16_t (before: char)
  bool safe_linking = false;      // 2.32: tcache and fastbin links are masked with their address
  uint64_t tcache_chunk = 0;      // the chunk holding a tcache_perthread_struct

  // struct malloc_state: mutex, flags, [have_fastchunks 2.27], fastbinsY[10], top,
  // last_remainder, bins[254], binmap[4], next, next_free, [attached_threads 2.23],
  // system_mem, max_system_mem.
  static MallocLayout of(int minor) {
    MallocLayout l;
    l.minor = minor;
    l.fastbins = minor >= 27 ? 16 : 8;
    l.top = l.fastbins + kFastbins * 8;
    l.next = l.top + 16 + 254 * 8 + 16;
    l.system_mem = l.next + 16 + (minor >= 23 ? 8 : 0);
    l.state_bytes = l.system_mem + 16;
    l.tcache = minor >= 26;
    l.tcache_u16 = minor >= 30;
    l.safe_linking = minor >= 32;
    const uint64_t st = (l.tcache_u16 ? 2 : 1) * kTcacheBins + 8 * kTcacheBins;
    l.tcache_chunk = (st + kSizeSz + kAlign - 1) & ~(kAlign - 1);
    return l;
  }
  // The initial top of an arena that never allocated: its own unsorted bin.
  uint64_t initial_top(uint64_t arena) const { return arena + top; }
  // A singly linked list's next pointer as stored at `where`.
  uint64_t reveal(uint64_t where, uint64_t stored) const {
    return safe_linking ? (where >> 12) ^ stored : stored;
  }
};

struct Heap {
  uint64_t lo = 0, hi = 0;   // the heap's bytes ([heap] or an arena heap's heap_info.size)
  uint64_t first = 0;        // its first chunk
  uint64_t end = 0;          // where its walk stops: the arena's top, or the end of an old heap
  bool has_top = false;      // the arena's top chunk is at `end`
};

struct Arena {
  uint64_t addr = 0;
  bool main = false;
  uint64_t top = 0, top_size = 0, system_mem = 0;
  std::vector<Heap> heaps;   // lowest first for the main arena, oldest first for the others
  std::vector<std::string> problems;
};

// main_arena: a word-aligned place in libc's writable data whose `next` ring returns to it
// within `max_arenas` hops, each a thread arena just after a heap_info at a 64 MiB boundary,
// and whose top is either its own unsorted bin (never used) or a chunk ending the [heap].
// The [heap] was read from /proc before this runs, while the target runs: a heap that grew
// meanwhile ends its top past heap_hi (a census in 42 of pgbench's postgres processes failed
// so once). If no place fits, a second pass takes a top anywhere from heap_lo on.
inline uint64_t find_main_arena(TargetMemory& mem, const MallocLayout& l,
                                const std::vector<std::pair<uint64_t, uint64_t>>& libc_data,
                                uint64_t heap_lo, uint64_t heap_hi, bool strict);
inline uint64_t find_main_arena(TargetMemory& mem, const MallocLayout& l,
                                const std::vector<std::pair<uint64_t, uint64_t>>& libc_data,
                                uint64_t heap_lo, uint64_t heap_hi) {
  const uint64_t a = find_main_arena(mem, l, libc_data, heap_lo, heap_hi, true);
  return a ? a : find_main_arena(mem, l, libc_data, heap_lo, heap_hi, false);
}
inline uint64_t find_main_arena(TargetMemory& mem, const MallocLayout& l,
                                const std::vector<std::pair<uint64_t, uint64_t>>& libc_data,
                                uint64_t heap_lo, uint64_t heap_hi, bool strict) {
  for (auto [lo, hi] : libc_data) {
    if (hi <= lo || hi - lo > (64u << 20)) continue;
    std::vector<uint64_t> words((hi - lo) / 8);
    if (!mem.read(lo, words.data(), words.size() * 8)) continue;
    for (size_t i = 0; i + l.state_bytes / 8 <= words.size(); i++) {
      const uint64_t a = lo + i * 8;
      const uint64_t next = words[i + l.next / 8], top = words[i + l.top / 8];
      const uint64_t off = next & (kHeapMax - 1);
      if (next != a && !(off == 32 || off == 48)) continue;  // sizeof(heap_info): 32, 48 (2.35)
      if (top != l.initial_top(a)) {
        if (!(heap_lo <= top && (top < heap_hi || !strict))) continue;
        uint64_t sz = 0;
        if (!mem.word(top + 8, &sz)) continue;
        const uint64_t end = top + chunk_size(sz);  // the brk, which the [heap] rounds up
        if (strict && (end > heap_hi || end + kPage <= heap_hi)) continue;
      }
      uint64_t at = next;
      for (int hops = 0; at != a && at && hops < 4096; hops++) {
        if (at & 7 || !mem.word(at + l.next, &at)) at = 0;
      }
      if (at == a) return a;
    }
  }
  return 0;
}

// An arena's heaps. The main arena: the [heap] (sbrk's), up to its top. A thread arena: the
// heap holding its top (top rounded down to 64 MiB), then each heap_info's `prev`; the first
// chunk of its first heap comes after the malloc_state, of the others after the heap_info.
inline Arena read_arena(TargetMemory& mem, const MallocLayout& l, uint64_t a, bool main,
                        uint64_t heap_lo, uint64_t heap_hi) {
  Arena ar;
  ar.addr = a;
  ar.main = main;
  if (!mem.word(a + l.top, &ar.top) || !mem.word(a + l.system_mem, &ar.system_mem)) {
    ar.problems.push_back("arena unreadable");
    return ar;
  }
  if (ar.top == l.initial_top(a)) return ar;  // never allocated from
  uint64_t sz = 0;
  if (!mem.word(ar.top + 8, &sz)) {
    ar.problems.push_back("top chunk unreadable");
    return ar;
  }
  ar.top_size = chunk_size(sz);
  if (main) {
    // A top past the [heap] read from /proc, but right after it: the heap grew since (the brk
    // is the top chunk's end).
    const uint64_t brk = (ar.top + ar.top_size + kPage - 1) & ~(kPage - 1);
    const bool grew = heap_hi && ar.top >= heap_hi && brk <= heap_hi + kHeapMax;
    if (!(heap_lo <= ar.top && (ar.top < heap_hi || grew))) {
      ar.problems.push_back("main arena's top is not in the [heap]: not contiguous, not walked");
      return ar;
    }
    Heap h;
    h.lo = heap_lo;
    h.hi = grew ? brk : heap_hi;
    h.first = (heap_lo + kAlign - 1) & ~(kAlign - 1);
    h.end = ar.top;
    h.has_top = true;
    ar.heaps.push_back(h);
    return ar;
  }
  std::vector<Heap> newest_first;
  uint64_t hp = ar.top & ~(kHeapMax - 1), info_bytes = 0;
  for (int n = 0; hp && n < 1 << 16; n++) {
    uint64_t info[4];  // ar_ptr, prev, size, mprotect_size
    if (!mem.read(hp, info, sizeof info) || info[0] != a || info[2] > kHeapMax ||
        info[2] < kPage || info[1] % kHeapMax) {
      ar.problems.push_back("heap_info unreadable or not this arena's: older heaps not walked");
      break;
    }
    Heap h;
    h.lo = hp;
    h.hi = hp + info[2];
    newest_first.push_back(h);
    if (a > hp && a < h.hi) info_bytes = a - hp;  // the first heap holds the arena
    hp = info[1];
  }
  if (!info_bytes) info_bytes = l.minor >= 35 ? 48 : 32;
  for (auto it = newest_first.rbegin(); it != newest_first.rend(); ++it) {
    Heap h = *it;
    if (a > h.lo && a < h.hi)
      h.first = (a + l.state_bytes + kAlign - 1) & ~(kAlign - 1);
    else
      h.first = h.lo + info_bytes;
    h.has_top = ar.top >= h.lo && ar.top < h.hi;
    h.end = h.has_top ? ar.top : h.hi;
    ar.heaps.push_back(h);
  }
  return ar;
}

}  // namespace memhook::census
