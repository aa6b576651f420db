// A live block's C++ dynamic type, read as the Itanium C++ ABI lays objects out: a polymorphic
// object starts with its vtable pointer; the vtable's word -2 is the offset to the top of the
// object (0 for the complete object a block starts with), word -1 its type_info; a type_info's
// word 0 is the vtable of one of __cxxabiv1's type_info classes and word 1 the mangled type name
// (without "_Z"). Only memory is read, so this works in stripped binaries. Each vtable is
// checked once; after that a block costs one hash lookup of its first word.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "target_memory.h"

namespace memhook::census {

struct FileRange {
  uint64_t lo, hi;
  int32_t module;  // the caller's index of the mapped file
  bool exec;
};

class DynamicTypes {
 public:
  struct Type {
    uint64_t vtable;
    std::string name;  // mangled, as the type_info holds it (a leading '*' dropped)
    int32_t module;    // whose mapping holds the vtable
  };

  // `files`: the target's file-backed mappings; `type_info_vtables`: where the vtables of
  // __class_type_info, __si_class_type_info and __vmi_class_type_info are (+16, as a type_info's
  // word 0 holds them). Without them, a type_info's word 0 need only point into a file.
  DynamicTypes(TargetMemory& mem, std::vector<FileRange> files,
               const std::vector<uint64_t>& type_info_vtables)
      : mem_(mem), files_(std::move(files)),
        ti_vtables_(type_info_vtables.begin(), type_info_vtables.end()) {
    std::sort(files_.begin(), files_.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
    if (!files_.empty()) {
      lo_ = files_.front().lo;
      for (auto& f : files_) hi_ = std::max(hi_, f.hi);
    }
    types_.push_back({0, "", -1});  // 0: no type
  }

  // The type id of a block whose first word is `w` (0: not a polymorphic object).
  uint32_t type_of(uint64_t w) {
    if (w & 7 || w < lo_ || w >= hi_) return 0;
    auto it = cache_.find(w);
    if (it != cache_.end()) return it->second;
    const uint32_t id = resolve(w);
    if (cache_.size() < (1u << 20)) cache_.emplace(w, id);
    return id;
  }
  const std::vector<Type>& types() const { return types_; }

 private:
  const FileRange* file_of(uint64_t a) const {
    auto it = std::upper_bound(files_.begin(), files_.end(), a,
                               [](uint64_t v, const FileRange& f) { return v < f.lo; });
    if (it == files_.begin()) return nullptr;
    --it;
    return a < it->hi ? &*it : nullptr;
  }
  static bool mangled_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '$' || c == '.';
  }
  uint32_t resolve(uint64_t vtable) {
    const FileRange* home = file_of(vtable);
    if (!home || home->exec) return 0;
    uint64_t head[2];  // offset to top, type_info
    if (!mem_.read(vtable - 16, head, sizeof head) || head[0] != 0 || head[1] & 7) return 0;
    const FileRange* ti_home = file_of(head[1]);
    if (!ti_home || ti_home->exec) return 0;
    uint64_t ti[2];  // its vtable, its name
    if (!mem_.read(head[1], ti, sizeof ti)) return 0;
    if (ti_vtables_.empty() ? !file_of(ti[0]) : !ti_vtables_.count(ti[0])) return 0;
    if (!file_of(ti[1])) return 0;
    char name[257];
    const size_t got = mem_.read_some(ti[1], name, 256);
    name[got] = 0;
    const size_t len = strnlen(name, got);
    if (len == got) return 0;  // not terminated within 256 bytes
    size_t start = name[0] == '*' ? 1 : 0;  // GCC marks types local to their object with '*'
    if (len <= start) return 0;
    for (size_t i = start; i < len; i++)
      if (!mangled_char(name[i])) return 0;
    types_.push_back({vtable, std::string(name + start, len - start), home->module});
    return uint32_t(types_.size() - 1);
  }

  TargetMemory& mem_;
  std::vector<FileRange> files_;
  std::unordered_set<uint64_t> ti_vtables_;
  uint64_t lo_ = 0, hi_ = 0;
  std::unordered_map<uint64_t, uint32_t> cache_;
  std::vector<Type> types_;
};

}  // namespace memhook::census
