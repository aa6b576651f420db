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
// And one of memhook's own, for CPython (valgrind has none, and reads every container Python
// holds as possibly lost):
//   pythonobject          a Python object tracked by the garbage collector is pointed to past
//                         the collector's header (16 bytes; 32 in 3.12 on where the object's
//                         dict and weak references come before it): ptr == start + 16 or + 32,
//                         and the word after it (ob_type) points to a type whose own type's
//                         type is PyType_Type.
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
  // python_type: PyType_Type's address in the target (0: no Python).
  InteriorHeuristics(Word word, const std::vector<Range>& readable_files,
                     const std::vector<Range>& executable_files, uint64_t python_type = 0)
      : word_(word), readable_(readable_files), executable_(executable_files),
        python_type_(python_type) {}

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
    if (python_type_ && (ptr == b.addr + 16 || ptr == b.addr + 32) && python_object(ptr))
      return true;
    uint64_t inner = 0;  // multipleinheritance
    return ptr % 8 == 0 && word_(ptr, &inner) && inner % 8 == 0 && inner >= 4096 &&
           first % 8 == 0 && first >= 4096 && vtable(inner) && vtable(first);
  }

 private:
  // ob_type, then its type, then that one's: PyType_Type (a metaclass's type is type too).
  bool python_object(uint64_t ptr) {
    uint64_t type = 0, meta = 0, meta_type = 0;
    return word_(ptr + 8, &type) && type % 8 == 0 && type >= 4096 && word_(type + 8, &meta) &&
           meta % 8 == 0 && meta >= 4096 &&
           (meta == python_type_ || (word_(meta + 8, &meta_type) && meta_type == python_type_));
  }

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
  uint64_t python_type_;
};

}  // namespace memhook::reachability
