// Operations, as reports name them: one per distinct hooks.def name, so that malloc, je_malloc
// and tc_malloc are one operation ("malloc") and a site's operations fit one 64-bit mask.
// Operation bit = 1 + the name's rank in first-appearance order (exec and spawn rows, which
// record nothing, have none); hooks 1-32 (one name each, in
// id order) keep bit = id, so captures from before the allocator APIs read the same.
#pragma once
#include <stdint.h>

#include "segment.h"

namespace memhook {

struct OperationBits {
  uint8_t bit[kMaxHooks] = {};
  int count = 0;
  static constexpr bool same(const char* a, const char* b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
  }
  constexpr OperationBits() {
    const char* name[kMaxHooks] = {};
    bool process[kMaxHooks] = {};  // (exec and spawn rows record nothing: no bit)
#define HOOK(id, sym, name_, kind) name[id] = name_, process[id] = #kind[0] == 'P';
#include "hooks.def"
#undef HOOK
    const char* seen[64] = {};
    for (int id = 1; id < kMaxHooks; id++) {
      if (!name[id] || process[id]) continue;
      int k = 0;
      while (k < count && !same(seen[k], name[id])) k++;
      if (k == count) seen[count++] = name[id];
      bit[id] = uint8_t(k + 1);
    }
  }
};
constexpr OperationBits kOperations;
static_assert(kOperations.count < 64, "operations must fit a site's 64-bit op mask");

// Each hook's row kind (hooks.def's letters: A, F, R, L, M, U, D, X), by id.
struct HookKinds {
  char kind[kMaxHooks] = {};
  constexpr HookKinds() {
#define HOOK(id, sym, name_, k) kind[id] = #k[0];
#include "hooks.def"
#undef HOOK
  }
};
constexpr HookKinds kHookKinds;
inline char hook_kind(uint32_t id) { return id < (uint32_t)kMaxHooks ? kHookKinds.kind[id] : 0; }

// The bit of hook `id` in a site's op mask.
constexpr uint64_t operation_bit(uint32_t id) {
  return id < (uint32_t)kMaxHooks && kOperations.bit[id] ? uint64_t(1) << kOperations.bit[id] : 0;
}

}  // namespace memhook
