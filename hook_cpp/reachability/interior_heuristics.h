// valgrind's heuristics for interior pointers (its default, --leak-check-heuristics=all): a
// pointer into a block, not to its start, that a C++ runtime keeps on purpose counts as
// reaching the block, as valgrind counts it:
//   stdstring             a pre-C++11 std::string points past its header (length, capacity,
//                         refcount): ptr == start + 24, a block of 24 + capacity + 1 bytes,
//                         length <= capacity;
//   length64              ptr == start + 8, the first word the bytes after it;
//   newarray              new[] of objects with a destructor points past the count (the array
//                         cookie): ptr == start + 8, the first word a count that divides the
//                         bytes after it;
//   multipleinheritance   a pointer to a secondary base: the word it points to and the block's
//                         first word are both vtable pointers.
// A vtable pointer, as valgrind judges one: it points into a readable file mapping, and of the
// first 20 words there, the non-zero ones point into executable file mappings, two at least.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "leak_marking.h"
#include "roots.h"

namespace memhook::reachability {

constexpr int kVtableWords = 20;

// `word(addr, &value)`: the target's word at addr (false if unreadable).
template <class Word>
class InteriorHeuristics {
 public:
  InteriorHeuristics(Word word, const std::vector<Range>& readable_files,
                     const std::vector<Range>& executable_files)
      : word_(word), readable_(readable_files), executable_(executable_files) {}

  bool operator()(const Block& b, uint64_t ptr) {
    uint64_t first = 0;
    if (!word_(b.addr, &first)) return false;
    if (ptr == b.addr + 24) {  // stdstring
      uint64_t capacity = 0;
      if (word_(b.addr + 8, &capacity) && capacity < b.size && 24 + capacity + 1 == b.size &&
          first <= capacity)
        return true;
    }
    if (ptr == b.addr + 8 && first > 0) {
      if (b.size - 8 == first) return true;        // length64
      if ((b.size - 8) % first == 0) return true;  // newarray
    }
    uint64_t inner = 0;  // multipleinheritance
    return ptr % 8 == 0 && word_(ptr, &inner) && inner % 8 == 0 && inner >= 4096 &&
           first % 8 == 0 && first >= 4096 && vtable(inner) && vtable(first);
  }

 private:
  static const Range* in(const std::vector<Range>& ranges, uint64_t a) {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), a,
                               [](uint64_t v, const Range& r) { return v < r.lo; });
    if (it == ranges.begin()) return nullptr;
    --it;
    return a < it->hi ? &*it : nullptr;
  }

  bool vtable(uint64_t v) {
    const Range* m = in(readable_, v);
    if (!m) return false;
    int functions = 0;
    for (int i = 0; i < kVtableWords && v + 8 * i + 8 <= m->hi; i++) {
      uint64_t f = 0;
      if (!word_(v + 8 * i, &f)) return false;
      if (!f) continue;  // (a vtable may hold null entries)
      if (!in(executable_, f)) return false;
      if (++functions == 2) return true;
    }
    return false;
  }

  Word word_;
  const std::vector<Range>& readable_;
  const std::vector<Range>& executable_;
};

}  // namespace memhook::reachability
