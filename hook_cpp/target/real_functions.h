// The hooked functions as the hook library sees them (hooks.def): ids, the real functions'
// types and addresses, and their ELF names for patching libraries loaded later.
#pragma once

namespace {

enum HookId : int {
#define HOOK(id, sym, name, kind, ret, params, args) ID_##sym = id,
#include "hooks.def"
#undef HOOK
};

#define HOOK(id, sym, name, kind, ret, params, args) using real_##sym##_t = ret(*) params;
#include "hooks.def"
#undef HOOK

struct SymbolTable {
  const char* name[kMaxHooks] = {};
  SymbolTable() {
#define HOOK(id, sym, name_, kind, ret, params, args) name[id] = #sym;
#include "hooks.def"
#undef HOOK
  }
};
const SymbolTable kSymbols;
#define kSymbol kSymbols.name

// The real functions in the target, written by memhook_start (memhook resolved them).
void* g_real[kMaxHooks] asm("memhook_g_real");

#define REAL(sym) ((real_##sym##_t)g_real[ID_##sym])

// Operator new calls malloc through libstdc++'s own (hooked) slot.
struct Nests {
  bool id[kMaxHooks] = {};
  constexpr Nests() {
    for (int i : {ID__Znwm, ID__Znam, ID__ZnwmRKSt9nothrow_t, ID__ZnamRKSt9nothrow_t,
                  ID__ZnwmSt11align_val_t, ID__ZnamSt11align_val_t,
                  ID__ZnwmSt11align_val_tRKSt9nothrow_t, ID__ZnamSt11align_val_tRKSt9nothrow_t})
      id[i] = true;
  }
  constexpr bool operator[](int i) const { return id[i]; }
};
constexpr Nests kNests;

}  // namespace
