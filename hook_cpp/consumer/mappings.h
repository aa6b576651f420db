// The program's own anonymous mappings in the session, in an accounting of their own (not the
// heap's): each range with the call stack that mapped it, as its mmap, munmap, mremap and
// madvise(MADV_DONTNEED) calls (hooks.def's mapping rows) made and changed them. An unmap may
// cut a range anywhere (its head, its tail, its middle); a mapping over a range (MAP_FIXED)
// replaces it.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <map>
#include <vector>

namespace memhook {

class Mappings {
 public:
  struct Region {
    uint64_t end;
    uint32_t stack;
  };
  struct PerStack {
    uint64_t maps = 0, mapped = 0, unmapped = 0, released = 0;
  };

  void map(uint64_t lo, uint64_t len, uint32_t stack) {
    if (!len) return;
    cut(lo, lo + len, false);
    regions_[lo] = {lo + len, stack};
    PerStack& s = of(stack);
    s.maps++;
    s.mapped += len;
  }
  // Returns whether any of [lo, lo + len) was a known mapping.
  bool unmap(uint64_t lo, uint64_t len) {
    const uint64_t known = cut(lo, lo + len, false);
    unknown_unmapped_ += len - known;
    return known != 0;
  }
  void release(uint64_t lo, uint64_t len) { cut(lo, lo + len, true); }

  const std::map<uint64_t, Region>& regions() const { return regions_; }
  const std::vector<PerStack>& per_stack() const { return per_stack_; }
  uint64_t unknown_unmapped() const { return unknown_unmapped_; }

 private:
  PerStack& of(uint32_t stack) {
    if (stack >= per_stack_.size()) per_stack_.resize(stack + 1);
    return per_stack_[stack];
  }
  // The parts of known ranges within [lo, hi): unmapped (cut out), or released (counted only).
  // Returns their bytes.
  uint64_t cut(uint64_t lo, uint64_t hi, bool release) {
    uint64_t total = 0;
    auto it = regions_.upper_bound(lo);
    if (it != regions_.begin() && std::prev(it)->second.end > lo) --it;
    while (it != regions_.end() && it->first < hi) {
      const uint64_t start = it->first;
      const Region r = it->second;
      const uint64_t a = std::max(start, lo), b = std::min(r.end, hi);
      total += b - a;
      if (release) {
        of(r.stack).released += b - a;
        ++it;
        continue;
      }
      of(r.stack).unmapped += b - a;
      it = regions_.erase(it);
      if (start < a) regions_[start] = {a, r.stack};
      if (b < r.end) it = regions_.emplace(b, Region{r.end, r.stack}).first, ++it;
    }
    return total;
  }

  std::map<uint64_t, Region> regions_;  // start -> end, stack
  std::vector<PerStack> per_stack_;
  uint64_t unknown_unmapped_ = 0;
};

}  // namespace memhook
