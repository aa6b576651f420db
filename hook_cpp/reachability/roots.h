// Where the leak check looks for pointers (the roots), read from /proc/PID/maps with every thread
// stopped, as valgrind takes them: every readable and writable mapping (modules' data and bss,
// the loader's and libc's, anonymous mappings, thread stacks with their TLS at the top), but
//   - a thread's stack only from its stack pointer (less the red zone) up: below lies stale data;
//   - a malloc heap (a mapping holding a block the check knows) only between its blocks, and
//     not at all when every block in it is known (glibc's heaps after a census at attach): the
//     blocks from before attach of another allocator are then scanned as roots;
//   - never memhook's own mappings (its segment, its library's data, its address table): they
//     hold the address of every block and would make every block reachable.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "arch.h"
#include "leak_marking.h"
#include "thread_stop.h"

namespace memhook::reachability {

// kJitCode: an anonymous mapping both writable and executable, where a JIT writes machine code
// (HotSpot's code cache): its pointers are instructions' immediates, at any byte.
enum RootKind : uint8_t { kData = 0, kStack, kHeapGap, kDynamicTls, kJitCode };

struct Range {
  uint64_t lo, hi;
  uint8_t kind = kData;
};

struct RootRanges {
  std::vector<Range> ranges;
  // File mappings, by address: readable ones, executable ones (where vtables and the functions
  // they point to lie: interior_heuristics.h).
  std::vector<Range> readable_files, executable_files;
  uint64_t stack_bytes = 0, data_bytes = 0, heap_gap_bytes = 0, tls_bytes = 0, excluded_bytes = 0;
  uint64_t jit_code_bytes = 0;
  void add(const Range& r) {
    const uint64_t n = r.hi - r.lo;
    (r.kind == kStack ? stack_bytes : r.kind == kHeapGap ? heap_gap_bytes
     : r.kind == kDynamicTls ? tls_bytes : r.kind == kJitCode ? jit_code_bytes : data_bytes) += n;
  }
};

constexpr uint64_t kGlibcHeapBytes = uint64_t(64) << 20;  // HEAP_MAX_SIZE on 64-bit

inline bool overlaps(const Range& a, const Range& b) { return a.lo < b.hi && b.lo < a.hi; }

// The block of `blocks` (sorted by address) that holds `p`, or null.
inline const Block* block_at(const std::vector<Block>& blocks, uint64_t p) {
  auto it = std::upper_bound(blocks.begin(), blocks.end(), p,
                             [](uint64_t v, const Block& b) { return v < b.addr; });
  if (it == blocks.begin()) return nullptr;
  --it;
  return p < it->addr + it->size ? &*it : nullptr;
}

// blocks: sorted by address (Marking::blocks()). exclude: ranges that are no root (memhook's
// own, glibc malloc's main_arena).
inline RootRanges root_ranges(int pid, const std::vector<Block>& blocks,
                              const std::vector<StoppedThread>& threads,
                              const std::vector<Range>& exclude, bool heaps_known) {
  RootRanges out;
  const std::string path = "/proc/" + std::to_string(pid) + "/maps";
  FILE* f = fopen(path.c_str(), "re");
  if (!f) return out;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8] = {0};
    int name_at = 0;
    if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, perms, &name_at) < 3) continue;
    std::string name = name_at ? std::string(line + name_at) : std::string();
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (!name.empty() && name[0] == '/' && perms[0] == 'r') {
      out.readable_files.push_back({lo, hi});
      if (perms[2] == 'x') out.executable_files.push_back({lo, hi});
    }
    if (perms[0] != 'r' || perms[1] != 'w') continue;
    if (name == "[vvar]" || name == "[vvar_vclock]" || name == "[vsyscall]" || name == "[vdso]")
      continue;
    const std::string base = name.substr(name.rfind('/') + 1);
    if (base.compare(0, 8, "memhook-") == 0) {  // memhook's segment
      out.excluded_bytes += hi - lo;
      continue;
    }
    // A heap: the first block at or after lo.
    auto it = std::lower_bound(blocks.begin(), blocks.end(), uint64_t(lo),
                               [](const Block& b, uint64_t v) { return b.addr < v; });
    const bool heap = it != blocks.end() && it->addr < hi;
    // A thread's stack: from the lowest stack pointer in it (less the red zone) to its end. In
    // a heap, a thread runs on a block (a signal handler's alternate stack malloc gave): that
    // block from its stack pointer up, and the heap is read as any heap.
    uint64_t sp = UINT64_MAX;
    for (const StoppedThread& t : threads) {
      if (t.sp() < lo || t.sp() >= hi) continue;
      const Block* b = heap ? block_at(blocks, t.sp()) : nullptr;
      if (b)
        out.ranges.push_back({std::max<uint64_t>(b->addr, (t.sp() - arch::kStackRedZone) &
                                                             ~uint64_t(7)),
                              (b->addr + b->size) & ~uint64_t(7), kStack});
      else
        sp = std::min(sp, t.sp());
    }
    if (sp != UINT64_MAX) {
      const uint64_t from = std::max<uint64_t>(lo, (sp - arch::kStackRedZone) & ~uint64_t(7));
      out.ranges.push_back({from, hi, kStack});
      continue;
    }
    if (heap) {
      // glibc's heaps, every block in them known: the main arena's ([heap]) and the others',
      // each at a multiple of its 64 MiB reservation. (An mmapped chunk's mapping may have
      // merged with the program's own: only its gaps are skipped, as for any other heap.)
      if (heaps_known && (name == "[heap]" || lo % kGlibcHeapBytes == 0)) continue;
      uint64_t at = lo;
      for (; it != blocks.end() && it->addr < hi; ++it) {
        if (it->addr > at) out.ranges.push_back({at, it->addr, kHeapGap});
        at = std::max(at, (it->addr + it->size + 7) & ~uint64_t(7));
      }
      if (at < hi) out.ranges.push_back({at, hi, kHeapGap});
      continue;
    }
    out.ranges.push_back({lo, hi, uint8_t(name.empty() && perms[2] == 'x' ? kJitCode : kData)});
  }
  fclose(f);
  // The ranges that are no root, cut out of the rest (main_arena lies in libc's data, beside
  // stdout's FILE and every other root there).
  std::vector<Range> kept;
  for (Range r : out.ranges) {
    std::vector<Range> pieces{r};
    for (const Range& e : exclude) {
      std::vector<Range> next;
      for (const Range& p : pieces) {
        if (!overlaps(p, e)) {
          next.push_back(p);
          continue;
        }
        out.excluded_bytes += std::min(p.hi, e.hi) - std::max(p.lo, e.lo);
        if (p.lo < e.lo) next.push_back({p.lo, e.lo, p.kind});
        if (e.hi < p.hi) next.push_back({e.hi, p.hi, p.kind});
      }
      pieces.swap(next);
    }
    kept.insert(kept.end(), pieces.begin(), pieces.end());
  }
  out.ranges.swap(kept);
  for (const Range& r : out.ranges) out.add(r);
  return out;
}

}  // namespace memhook::reachability
