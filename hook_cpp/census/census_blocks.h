// The live blocks the census found before attach, kept so that the session's frees of them
// (frees of pointers the session never saw allocated) are matched to them: the report can then
// say how many pre-attach blocks of each size and type were freed, and how many are still held.
// Compact on purpose, a big process has tens of millions: per heap, each block's offset in
// 16-byte units (4 bytes) and its class, a (usable size, type) pair (2 bytes).
#pragma once
#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace memhook::census {

class CensusBlocks {
 public:
  struct Class {
    uint64_t usable;
    uint32_t type;
    uint64_t blocks = 0, freed = 0;
  };

  // While walking: a live block at user pointer p, of `usable` bytes and type id `type`, in the
  // range starting at `base` (a heap, or one mmapped chunk). Blocks come in address order.
  void add(uint64_t base, uint64_t p, uint64_t usable, uint32_t type) {
    if (heaps_.empty() || heaps_.back().base != base) heaps_.push_back({base, {}, {}});
    Range& r = heaps_.back();
    const uint64_t off = (p - base) / 16;
    if ((p - base) % 16 || off > UINT32_MAX) return;
    r.offs.push_back(uint32_t(off));
    r.cls.push_back(class_of(usable, type));
    classes_[r.cls.back()].blocks++;
  }
  // The census found that a block it counted live was not (a tcache entry or struct).
  void remove(uint64_t p) {
    uint16_t* c = find(p);
    if (c && *c) classes_[*c].blocks--, *c = 0;
  }
  // After the walk: ranges sorted by base, for lookups.
  void seal() {
    std::sort(heaps_.begin(), heaps_.end(), [](auto& a, auto& b) { return a.base < b.base; });
  }
  // A free the session could not match: true if it freed a block the census counted.
  bool freed(uint64_t p) {
    uint16_t* c = find(p);
    if (!c || !*c) return false;
    classes_[*c].freed++;
    *c = 0;  // once: the address may be reused and freed again (then it is not a census block)
    return true;
  }
  // (usable, type, blocks at the census, freed since), one row per class.
  std::vector<Class> classes() const {
    std::vector<Class> out(classes_.begin() + 1, classes_.end());
    return out;
  }
  // Every census block still held (not freed in the session): fn(p, usable).
  template <class Fn>
  void for_each_held(Fn fn) const {
    for (const Range& r : heaps_)
      for (size_t i = 0; i < r.offs.size(); i++)
        if (r.cls[i]) fn(r.base + uint64_t(r.offs[i]) * 16, classes_[r.cls[i]].usable);
  }
  // The class (usable size, type) of census block p, still held; nullptr if p is none.
  const Class* class_at(uint64_t p) const {
    const uint16_t* c = const_cast<CensusBlocks*>(this)->find(p);  // (find only reads)
    return c && *c ? &classes_[*c] : nullptr;
  }
  size_t memory_bytes() const {
    size_t n = classes_.size() * sizeof(Class);
    for (auto& r : heaps_) n += r.offs.capacity() * 4 + r.cls.capacity() * 2;
    return n;
  }

 private:
  // Classes beyond 65534 share one row, of usable size 0: counted, their bytes unknown.
  static constexpr uint16_t kOverflow = UINT16_MAX;
  struct Range {
    uint64_t base;
    std::vector<uint32_t> offs;
    std::vector<uint16_t> cls;  // 0: not (or no longer) a census block
  };

  uint16_t class_of(uint64_t usable, uint32_t type) {
    if (usable >> 40 || type >> 24) return overflow();
    const uint64_t key = usable << 24 | type;
    if (key == last_key_) return last_class_;
    auto it = index_.find(key);
    if (it == index_.end()) {
      if (classes_.size() >= kOverflow) return overflow();
      it = index_.emplace(key, uint16_t(classes_.size())).first;
      classes_.push_back({usable, type});
    }
    last_key_ = key;
    return last_class_ = it->second;
  }
  uint16_t overflow() {
    while (classes_.size() <= kOverflow) classes_.push_back({0, 0});
    return kOverflow;
  }
  uint16_t* find(uint64_t p) {
    auto it = std::upper_bound(heaps_.begin(), heaps_.end(), p,
                               [](uint64_t v, const Range& r) { return v < r.base; });
    if (it == heaps_.begin()) return nullptr;
    Range& r = *--it;
    if ((p - r.base) % 16 || (p - r.base) / 16 > UINT32_MAX) return nullptr;
    const uint32_t off = uint32_t((p - r.base) / 16);
    auto at = std::lower_bound(r.offs.begin(), r.offs.end(), off);
    if (at == r.offs.end() || *at != off) return nullptr;
    return &r.cls[size_t(at - r.offs.begin())];
  }

  std::vector<Range> heaps_;
  std::vector<Class> classes_{Class{0, 0}};  // row 0: none
  std::unordered_map<uint64_t, uint16_t> index_;  // usable << 24 | type -> class
  uint64_t last_key_ = ~0ull;
  uint16_t last_class_ = 0;
};

}  // namespace memhook::census
