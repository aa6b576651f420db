// The hooked functions as the hook library sees them (hooks.def): ids, the real functions'
// types and addresses, and their ELF names for patching libraries loaded later.
#pragma once

#include <spawn.h>  // (the rows' types: posix_spawn's, popen's FILE)
#include <stdio.h>

namespace {

enum HookId : int {
#define HOOK(id, sym, name, kind) ID_##sym = id,
#include "hooks.def"
#undef HOOK
};

#define ALLOC(id, sym, name, ret, params, ...) using real_##sym##_t = ret(*) params;
#define FREE(id, sym, name, params, args) using real_##sym##_t = void(*) params;
#define REALLOC(id, sym, name, params, args, size) using real_##sym##_t = void*(*) params;
#define LOADER(id, sym, name, ret, params, args) using real_##sym##_t = ret(*) params;
#define RESIZE(id, sym, name, params, ...) using real_##sym##_t = size_t(*) params;
#define MAP(id, sym, name, params, ...) using real_##sym##_t = void*(*) params;
#define UNMAP(id, sym, name, ret, params, ...) using real_##sym##_t = ret(*) params;
#define RELEASE(id, sym, name, ret, params, ...) using real_##sym##_t = ret(*) params;
#define REMAP(id, sym, name, params, ...) using real_##sym##_t = void*(*) params;
#include "hooks.def"

// Each hook's ELF symbol, by id.
struct SymbolTable {
  const char* name[kMaxHooks] = {};
  constexpr SymbolTable() {
#define HOOK(id, sym, name_, kind) name[id] = #sym;
#include "hooks.def"
#undef HOOK
  }
};
constexpr SymbolTable kSymbols;
#define kSymbol kSymbols.name

}  // namespace

// The real functions in the target, written by memhook_start (memhook resolved them). Global
// (hidden): malloc_entry.S calls malloc through it.
void* g_real[kMaxHooks] asm("memhook_g_real");

#define REAL(sym) ((real_##sym##_t)g_real[ID_##sym])
