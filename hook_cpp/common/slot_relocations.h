// The relocations that store a function's address in a slot memhook patches, as each processor's
// arch.h lists them (kSlotRelocations): the one list the hook library's late patching reads, and
// memhook's scan through the consumer module (memhook/common/arch.py).
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace memhook {
namespace arch {

struct SlotRelocation {
  uint32_t type;
  const char* name;
  bool zero_addend;  // only with addend 0 (a function pointer in data, not an offset into one)
};

// Is a relocation of `type` with `addend` a slot, by `list` (arch::kSlotRelocations)?
template <size_t N>
inline bool slot_relocation(const SlotRelocation (&list)[N], uint32_t type, int64_t addend) {
  for (const SlotRelocation& r : list)
    if (type == r.type) return !r.zero_addend || addend == 0;
  return false;
}

}  // namespace arch
}  // namespace memhook
