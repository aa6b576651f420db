// The census of glibc malloc's heap, taken from outside the process while it runs: every chunk
// of every arena's heaps and every mmapped chunk, each classified live or free (free: in a bin,
// the top chunk, a fastbin or a tcache, the last two looking in use by their bits), live blocks
// counted by size and by C++ dynamic type, the allocator's free space and what malloc_trim(0)
// would return. Nothing is written to the target and nothing stops it: each chunk header is
// validated as read, and what cannot be read consistently is counted as uncertain.
#pragma once
#include <chrono>
#include <memory>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "census_blocks.h"
#include "dynamic_types.h"
#include "glibc_malloc.h"
#include "target_memory.h"

namespace memhook::census {

struct Tally {
  uint64_t count = 0, bytes = 0;
  void add(uint64_t b) { count++, bytes += b; }
  void sub(uint64_t b) { count--, bytes -= b; }
};

struct HeapStats {
  Heap heap;
  uint64_t walked_to = 0;       // where the walk stopped (heap.end when whole)
  uint64_t chunks = 0;
  Tally live;                   // usable bytes (chunk size - 8)
  uint64_t live_end = 0;        // end of the highest live chunk: fragmentation's space ends here
  uint64_t last_live = 0, last_live_size = 0;  // the block that pins the top (user address)
  uint32_t last_live_type = 0;
  uint64_t resident = 0, resident_live = 0, resident_free = 0;
  std::string problem;
  ResidentPages pages;
};

struct ArenaStats {
  Arena arena;
  std::vector<HeapStats> heaps;
  Tally bins, fastbins, tcache;  // chunk bytes
  uint64_t top_resident = 0, largest_free = 0, trimmable = 0, uncertain = 0;
};

struct CensusInput {
  int minor = 0;  // glibc 2.<minor>
  std::vector<std::pair<uint64_t, uint64_t>> libc_data;  // libc's writable file mappings
  uint64_t heap_lo = 0, heap_hi = 0;                     // the [heap], if any
  std::vector<std::pair<uint64_t, uint64_t>> anonymous;  // other private anonymous rw mappings
  std::vector<FileRange> files;
  std::vector<uint64_t> type_info_vtables;
};

struct Census {
  std::string problem;  // why there is no census ("" when there is)
  uint64_t main_arena = 0;
  std::vector<ArenaStats> arenas;
  Tally mmapped;                 // usable bytes of malloc's mmapped chunks
  uint64_t mmapped_resident = 0, mmapped_unsearched = 0;
  std::vector<std::pair<uint64_t, uint64_t>> mmapped_ranges;  // the mappings they fill
  std::unordered_map<uint64_t, Tally> by_size;  // usable size -> live blocks
  std::vector<Tally> by_type;                   // type id -> live blocks
  std::vector<DynamicTypes::Type> types;
  uint64_t tcache_structs = 0, uncertain = 0, heap_bytes = 0, bytes_read = 0, elapsed_ns = 0;
  std::vector<std::string> problems;
  std::shared_ptr<CensusBlocks> blocks;  // the live blocks, when kept (to match later frees)
};

class HeapCensus {
 public:
  // keep_blocks: keep every live block found (census_blocks.h, 6 bytes each).
  HeapCensus(int mem_fd, int pagemap_fd, CensusInput in, bool keep_blocks)
      : mem_(mem_fd), pagemap_fd_(pagemap_fd), in_(std::move(in)),
        l_(MallocLayout::of(in_.minor)), types_(mem_, in_.files, in_.type_info_vtables) {
    if (keep_blocks) c_.blocks = std::make_shared<CensusBlocks>();
  }

  Census run() {
    const auto t0 = std::chrono::steady_clock::now();
    c_.main_arena = find_main_arena(mem_, l_, in_.libc_data, in_.heap_lo, in_.heap_hi);
    if (!c_.main_arena) {
      c_.problem = "main_arena not found in libc's data";
    } else {
      uint64_t a = c_.main_arena;
      for (int n = 0; n < 4096; n++) {
        census_arena(a, a == c_.main_arena);
        if (!mem_.word(a + l_.next, &a) || a == c_.main_arena || !a) break;
      }
      census_mmapped();
      if (c_.blocks) c_.blocks->seal();
      // After every arena's walk: a thread's tcache holds chunks of any arena.
      for (auto& t : tcache_candidates_) check_tcache(t);
    }
    c_.by_type.resize(types_.types().size());
    for (size_t i = 0; i < by_type_.size() && i < c_.by_type.size(); i++) c_.by_type[i] = by_type_[i];
    c_.types = types_.types();
    c_.bytes_read = mem_.bytes_read();
    c_.elapsed_ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - t0).count());
    return std::move(c_);
  }

 private:
  struct Chunk {
    uint64_t addr, size, first_word;
  };
  struct TcacheCandidate {
    uint64_t chunk;
    uint32_t type;
    size_t arena, heap;
  };

  void count_live(uint64_t usable, uint32_t type, int sign) {
    Tally& s = c_.by_size[usable];
    if (type >= by_type_.size()) by_type_.resize(type + 1);
    if (sign > 0) s.add(usable), by_type_[type].add(usable);
    else s.sub(usable), by_type_[type].sub(usable);
  }

  // Every chunk on the arena's fastbin lists (they look in use by their bits).
  std::unordered_set<uint64_t> fastbin_chunks(ArenaStats& as) {
    std::unordered_set<uint64_t> out;
    uint64_t heads[kFastbins];
    if (!mem_.read(as.arena.addr + l_.fastbins, heads, sizeof heads)) return out;
    for (int i = 0; i < kFastbins; i++) {
      uint64_t p = heads[i];
      for (int n = 0; p && n < (1 << 22); n++) {
        uint64_t hdr[3];  // prev_size, size, fd
        if (p % kAlign || !mem_.read(p, hdr, sizeof hdr) ||
            chunk_size(hdr[1]) != uint64_t(i + 2) * kAlign || !out.insert(p).second) {
          as.arena.problems.push_back("fastbin " + std::to_string(i) +
                                      " changed while read: its rest not counted");
          break;
        }
        p = l_.reveal(p + 16, hdr[2]);
      }
    }
    return out;
  }

  void census_arena(uint64_t a, bool main) {
    ArenaStats as;
    as.arena = read_arena(mem_, l_, a, main, in_.heap_lo, in_.heap_hi);
    const size_t ai = c_.arenas.size();
    const std::unordered_set<uint64_t> fast = fastbin_chunks(as);
    for (const Heap& h : as.arena.heaps) {
      HeapStats hs;
      hs.heap = h;
      walk(h, hs, as, fast, ai, as.heaps.size());
      as.heaps.push_back(std::move(hs));
    }
    c_.arenas.push_back(std::move(as));
  }

  // One heap, chunk by chunk from its first to its top (or its fencepost). A chunk is in use
  // when the next one's PREV_INUSE bit says so; runs of free and fastbin chunks are what
  // malloc_consolidate would merge, and malloc_trim(0) returns their whole pages.
  void walk(const Heap& h, HeapStats& hs, ArenaStats& as, const std::unordered_set<uint64_t>& fast,
            size_t ai, size_t hi) {
    hs.pages = ResidentPages(pagemap_fd_, h.lo, h.hi);
    const ResidentPages& pages = hs.pages;
    Window win(mem_, pages, h.hi);
    hs.resident = pages.bytes(h.lo, h.hi);
    hs.live_end = h.first;
    c_.heap_bytes += h.end - h.lo;
    uint64_t run_start = 0, run_end = 0;
    auto close_run = [&]() {
      if (!run_start) return;
      if (run_end - run_start > kPage - 1 + 48) {
        const uint64_t from = (run_start + 48 + kPage - 1) & ~(kPage - 1);
        if (run_end > from) as.trimmable += pages.bytes(from, from + ((run_end - from) & ~(kPage - 1)));
      }
      run_start = 0;
    };
    auto finish = [&](const Chunk& ch, bool in_use) {
      const bool in_fastbin = in_use && fast.count(ch.addr);
      const uint64_t res = pages.bytes(ch.addr, ch.addr + ch.size);
      if (in_use && !in_fastbin) {
        const uint32_t type = types_.type_of(ch.first_word);
        count_live(ch.size - kSizeSz, type, +1);
        if (c_.blocks) c_.blocks->add(h.lo, ch.addr + 16, ch.size - kSizeSz, type);
        hs.live.add(ch.size - kSizeSz);
        hs.resident_live += res;
        hs.live_end = ch.addr + ch.size;
        hs.last_live = ch.addr + 16, hs.last_live_size = ch.size - kSizeSz, hs.last_live_type = type;
        if (l_.tcache && ch.size == l_.tcache_chunk) tcache_candidates_.push_back({ch.addr, type, ai, hi});
        close_run();
        return;
      }
      hs.resident_free += res;
      (in_fastbin ? as.fastbins : as.bins).add(ch.size);
      if (!in_fastbin) as.largest_free = std::max(as.largest_free, ch.size);
      if (!run_start) run_start = ch.addr;
      run_end = ch.addr + ch.size;
    };
    Chunk prev{0, 0, 0};
    uint64_t p = h.first;
    for (;;) {
      const uint8_t* b = nullptr;
      uint64_t hdr[3] = {0, 0, 0};
      bool ok = false;
      for (int attempt = 0; attempt < 3 && !ok; attempt++) {
        b = win.at(p, 24, attempt > 0);
        if (!b) continue;
        memcpy(hdr, b, sizeof hdr);
        const uint64_t s = chunk_size(hdr[1]);
        if (p == h.end && h.has_top) {
          ok = true;  // the top chunk: only its PREV_INUSE bit is wanted
        } else if (!h.has_top && s < kMinSize && s % kAlign == 0) {
          ok = true;  // the fencepost that closes an old heap
        } else {
          ok = s >= kMinSize && s % kAlign == 0 && p + s <= h.end && !(hdr[1] & kIsMmapped) &&
               !(as.arena.main && (hdr[1] & kNonMainArena));
        }
      }
      if (!ok) {
        hs.problem = "chunk at 0x" + hex(p) + (b ? " has an impossible header (size field 0x" +
                                                       hex(hdr[1]) + ")"
                                                 : " cannot be read") +
                     ": the walk stopped there";
        as.uncertain += h.end - p;
        c_.uncertain += h.end - p;
        break;
      }
      if (prev.size) finish(prev, hdr[1] & kPrevInuse);
      const uint64_t s = chunk_size(hdr[1]);
      if ((p == h.end && h.has_top) || s < kMinSize) break;
      hs.chunks++;
      prev = {p, s, hdr[2]};
      p += s;
      if (p > h.end || (!h.has_top && p == h.end)) {
        hs.problem = "heap ends without a fencepost at 0x" + hex(p);
        break;
      }
    }
    hs.walked_to = p;
    if (h.has_top && hs.problem.empty()) {
      // malloc_trim(0): the main arena's top (with a run merged into it) is cut back to the
      // page after MINSIZE; thread arenas' tops are not trimmed by it.
      const uint64_t top_end = as.arena.top + as.arena.top_size;
      hs.resident_free += as.top_resident = pages.bytes(as.arena.top, std::min(top_end, h.hi));
      if (as.arena.main) {
        const uint64_t start = run_start ? run_start : as.arena.top;
        const uint64_t area = top_end - start;
        if (area > kMinSize + 1) {
          const uint64_t extra = (area - kMinSize - 1) & ~(kPage - 1);
          as.trimmable += pages.bytes(top_end - extra, top_end);
        }
      }
      run_start = 0;
    }
    close_run();
  }

  // A chunk the size of a tcache_perthread_struct is one when its counts and entries agree:
  // each non-empty bin a list of exactly `count` chunks of that bin's size. Its entries are
  // then free (tcache), itself the allocator's.
  void check_tcache(const TcacheCandidate& t) {
    const size_t cb = l_.tcache_u16 ? 2 : 1;
    std::vector<uint8_t> raw(cb * kTcacheBins + 8 * kTcacheBins);
    if (!mem_.read(t.chunk + 16, raw.data(), raw.size())) return;
    std::vector<std::pair<uint64_t, uint64_t>> entries;  // chunk, size
    uint64_t any = 0;
    for (int i = 0; i < kTcacheBins; i++) {
      const uint64_t count = cb == 2 ? (raw[2 * i] | raw[2 * i + 1] << 8) : raw[i];
      uint64_t e;
      memcpy(&e, raw.data() + cb * kTcacheBins + 8 * i, 8);
      any |= count | e;
      if (!count) {
        if (e) return;
        continue;
      }
      for (uint64_t n = 0; n < count; n++) {
        uint64_t hdr[3];  // prev_size, size, next (at the user pointer)
        if (!e || e % kAlign || !mem_.read(e - 16, hdr, sizeof hdr) ||
            chunk_size(hdr[1]) != uint64_t(i) * kAlign + kMinSize)
          return;
        entries.push_back({e - 16, chunk_size(hdr[1])});
        e = l_.reveal(e, hdr[2]);
      }
      if (e) return;  // the list is longer than its count says
    }
    // An all-zero struct is a tcache only where one is allocated first: at its heap's start.
    HeapStats& own = c_.arenas[t.arena].heaps[t.heap];
    if (!any && t.chunk != own.heap.first) return;
    c_.tcache_structs++;
    count_live(l_.tcache_chunk - kSizeSz, t.type, -1);
    if (c_.blocks) c_.blocks->remove(t.chunk + 16);
    own.live.sub(l_.tcache_chunk - kSizeSz);
    own.resident_live -= own.pages.bytes(t.chunk, t.chunk + l_.tcache_chunk);
    for (auto [chunk, size] : entries) {
      uint64_t w = 0;
      mem_.word(chunk + 16, &w);
      count_live(size - kSizeSz, types_.type_of(w), -1);
      if (c_.blocks) c_.blocks->remove(chunk + 16);
      for (ArenaStats& as : c_.arenas)
        for (HeapStats& hs : as.heaps)
          if (chunk >= hs.heap.lo && chunk < hs.heap.hi) {
            hs.live.sub(size - kSizeSz);
            as.tcache.add(size);
            const uint64_t res = hs.pages.bytes(chunk, chunk + size);
            hs.resident_live -= res;
            hs.resident_free += res;
          }
    }
  }

  // malloc's mmapped chunks: at a page boundary of a private anonymous mapping, a chunk whose
  // size field is a whole number of pages with IS_MMAPPED alone set. The kernel merges
  // adjacent anonymous mappings of equal flags, so a chunk may lie anywhere in one (beside a
  // thread's stack or the program's own mmap, as on Linux 6.1): every touched page is looked
  // at, up to kMmappedSearchPages of them; past that, the bytes left are
  // said unsearched.
  static constexpr uint64_t kMmappedSearchPages = uint64_t(1) << 18;  // 1 GiB of pages
  void census_mmapped() {
    uint64_t searched = 0;
    for (auto [lo, hi] : in_.anonymous) {
      bool arena_heap = false;
      for (auto& as : c_.arenas)
        for (auto& hs : as.heaps) arena_heap |= hs.heap.lo >= lo && hs.heap.lo < hi;
      if (arena_heap) continue;
      const ResidentPages pages(pagemap_fd_, lo, hi);
      for (uint64_t p = lo; p + kPage <= hi;) {
        // (a page never touched, or given back, is not read: reading it would map it)
        if (pages.known() && !pages.in_memory_or_swap(p)) {
          p += kPage;
          continue;
        }
        if (++searched > kMmappedSearchPages) {
          c_.mmapped_unsearched += hi - p;
          break;
        }
        uint64_t hdr[3];
        const uint64_t s = mem_.read(p, hdr, sizeof hdr) && hdr[0] == 0 &&
                           (hdr[1] & kFlags) == kIsMmapped ? chunk_size(hdr[1]) : 0;
        if (s % kPage || s == 0 || p + s > hi) {
          p += kPage;
          continue;
        }
        c_.mmapped.add(s - 2 * kSizeSz);
        c_.mmapped_resident += pages.bytes(p, p + s);
        const uint32_t type = types_.type_of(hdr[2]);
        count_live(s - 2 * kSizeSz, type, +1);
        if (c_.blocks) c_.blocks->add(p, p + 16, s - 2 * kSizeSz, type);
        c_.mmapped_ranges.push_back({p, p + s});
        p += s;
      }
    }
  }

  static std::string hex(uint64_t v) {
    char b[24];
    snprintf(b, sizeof b, "%lx", (unsigned long)v);
    return b;
  }

  TargetMemory mem_;
  int pagemap_fd_;
  CensusInput in_;
  MallocLayout l_;
  DynamicTypes types_;
  Census c_;
  std::vector<Tally> by_type_;
  std::vector<TcacheCandidate> tcache_candidates_;
};

}  // namespace memhook::census
