// The entry points GOT slots are pointed at, generated for each row of hooks.def: each calls the
// real function and has the record written (records.h). For an allocation:
//   memhook_hook_X    records every call: fast_X, or for malloc, the hottest, malloc_entry.S
//                     (which falls back to memhook_record_malloc below);
//   fast_X            full tracing's short path around the real call, whose frame sits directly
//                     below the caller's; anything else (sampling, a size filter, operator new,
//                     nested or inactive calls) goes to slow_X, which walks from the hook's frame
//                     all the same (a sibling call reuses it);
//   memhook_sample_X  sampling sessions: counts the thread's countdown down and tail-calls the
//                     real function while no sample is due (no frame of its own), else fast_X;
//   memhook_filter_X  size-filter sessions: fast_X itself.
// Which a slot gets is common/routing.h's choice.
#pragma once

// Exceptions (std::bad_alloc) unwind through the operator-new hooks and must reset the
// recursion guard. The personality routine lives in libstdc++, which is loaded wherever
// operator new is; a weak reference keeps C targets free of libstdc++.
asm(".weak __gxx_personality_v0");
#ifdef MEMHOOK_MUSL
// On musl the unwinder is libgcc_s, loaded with libstdc++ in every C++ target: weak as well, so
// that the library names no libgcc_s (C targets on Alpine may not have it) and links no copy.
asm(".weak _Unwind_Resume");
#endif

namespace {
inline uint64_t page_round(uint64_t n) { return (n + 4095) & ~uint64_t(4095); }  // pvalloc
}  // namespace

#define PASS_THROUGH(sym, args)                                        \
  ThreadState& t = t_state;                                            \
  if (__builtin_expect(!active() || t.in_hook, 0)) return REAL(sym) args;

#define UNPAREN(...) __VA_ARGS__

// The every-call entry: the fast hook itself, or one written by hand.
#define EVERY_CALL_ENTRY_fast(sym, ret, params)                        \
  extern "C" __attribute__((visibility("default"), alias("fast_" #sym))) ret \
  memhook_hook_##sym params;
#if MEMHOOK_MALLOC_ENTRY
#define EVERY_CALL_ENTRY_asm(sym, ret, params) extern "C" ret memhook_hook_##sym params;
#else  // (no hand-written entry on this processor: arch.h)
#define EVERY_CALL_ENTRY_asm EVERY_CALL_ENTRY_fast
#endif

// nests: the function's own malloc is part of this call (operator new), so the guard is held
// across the real call even when nothing is recorded.
#define ALLOC(id, sym, name, ret, params, args, size_expr, result_ptr, nests, every) \
  __attribute__((noinline)) static ret slow_##sym(HookFrame fp, UNPAREN params) { \
    ThreadState& t = t_state;                                          \
    const uint64_t size = (size_expr);                                 \
    const int m = mode();                                              \
    if (m == kOff || t.in_hook || (m == kSelective && !chosen_slow(t, size))) { \
      if (!nests) return REAL(sym) args;                               \
      Guard guard(t);                                                  \
      return REAL(sym) args;                                           \
    }                                                                  \
    Guard guard(t);                                                    \
    ret result = REAL(sym) args;                                       \
    if (void* p = (result_ptr)) {                                      \
      if (g_sample_rate) count_sampled((uint64_t)p, +1);               \
      record_alloc(t, ID_##sym, p, size, origin_of(fp));               \
    }                                                                  \
    return result;                                                     \
  }                                                                    \
  extern "C" __attribute__((visibility("hidden"))) ret fast_##sym params { \
    ThreadState& t = t_state;                                          \
    HookFrame fp = MEMHOOK_HOOK_FRAME();                               \
    /* operator new keeps the guard across its inner malloc: slow_* */ \
    if (__builtin_expect(mode() != kEvery || t.in_hook, 0) || nests)   \
      return slow_##sym(fp, UNPAREN args);                             \
    const uint64_t size = (size_expr);                                 \
    ret result = REAL(sym) args;                                       \
    /* fp read again: held across the call it would cost a register */ \
    if (void* p = (result_ptr))                                        \
      record_alloc_now<ID_##sym>(p, size, origin_of(MEMHOOK_HOOK_FRAME())); \
    return result;                                                     \
  }                                                                    \
  EVERY_CALL_ENTRY_##every(sym, ret, params)                           \
  /* 64-byte aligned: straddling a line cost it 0.03x at 16 B */      \
  extern "C" __attribute__((visibility("default"), optimize("omit-frame-pointer"), \
                            aligned(64))) ret                          \
  memhook_sample_##sym params {                                        \
    ThreadState& t = t_state;                                          \
    if (__builtin_expect(count_down(t, (size_expr)), 1)) {             \
      if (!nests) return REAL(sym) args;                               \
      Guard guard(t); /* its inner malloc is this call, not another */ \
      return REAL(sym) args;                                           \
    }                                                                  \
    return fast_##sym args;                                            \
  }                                                                    \
  extern "C" __attribute__((visibility("default"), alias("fast_" #sym))) ret \
  memhook_filter_##sym params;

// Frees are recorded before the real call. In sampling mode only frees of sampled blocks are
// recorded (sampled_live says which), and the sampling entry (memhook_sample_*) passes every
// other free straight to the real function. Plain free calls nothing hooked: on its short path
// the guard ends before it, and it is a tail call.
#define FREE(id, sym, name, params, args)                              \
  __attribute__((noinline)) static void slow_##sym(HookFrame fp, UNPAREN params) { \
    if (!p) return REAL(sym) args;                                     \
    PASS_THROUGH(sym, args)                                            \
    enter(t);                                                          \
    if (!g_sample_rate || sampled_live((uint64_t)p)) {                 \
      record_free(t, ID_##sym, p, fp);                                 \
      if (g_sample_rate) count_sampled((uint64_t)p, -1);               \
    }                                                                  \
    REAL(sym) args;                                                    \
    leave(t);                                                          \
  }                                                                    \
  extern "C" __attribute__((visibility("default"))) void memhook_hook_##sym params { \
    ThreadState& t = t_state;                                          \
    HookFrame fp = MEMHOOK_HOOK_FRAME();                               \
    /* operator delete keeps the guard across its inner free: slow_* */ \
    if (__builtin_expect(!p || mode() != kEvery || t.in_hook, 0) || ID_##sym != ID_free) \
      return slow_##sym(fp, UNPAREN args);                             \
    enter(t);                                                          \
    record_free(t, ID_##sym, p, fp);                                   \
    leave(t);                                                          \
    return REAL(sym) args;                                             \
  }                                                                    \
  extern "C" __attribute__((visibility("default"), optimize("omit-frame-pointer"))) void \
  memhook_sample_##sym params {                                        \
    if (!p || !sampled_live((uint64_t)p)) return REAL(sym) args;       \
    return memhook_hook_##sym args;                                    \
  }

// realloc-like: record_realloc (records.h) makes the real call. Its guard is held across the
// call even when nothing is recorded: musl's realloc, __rust_realloc and an allocator's own
// API may reach another hooked function, and that call is part of this one.
#define REALLOC(id, sym, name, params, args, size_expr)                \
  extern "C" __attribute__((visibility("default"))) void* memhook_hook_##sym params { \
    PASS_THROUGH(sym, args)                                            \
    uint64_t size = (size_expr);                                       \
    bool track_old = p && (!g_sample_rate || sampled_live((uint64_t)p)); \
    bool track_new = !g_selective || chosen(t, size);                  \
    Guard guard(t);                                                    \
    if (!track_old && !track_new) return REAL(sym) args;               \
    return record_realloc(t, ID_##sym, p, size, track_old, track_new,  \
                          MEMHOOK_HOOK_FRAME(),                        \
                          [&]() -> void* { return REAL(sym) args; });  \
  }

// In-place resize (jemalloc's xallocx): the block keeps its address. One that grew or shrank
// to at least the size asked for is recorded as a realloc to itself, of that size (up to
// size + extra, as the call got); one that could not is left as it was (a record of nothing).
#define RESIZE(id, sym, name, params, args, size_expr, extra_expr)     \
  extern "C" __attribute__((visibility("default"))) size_t memhook_hook_##sym params { \
    PASS_THROUGH(sym, args)                                            \
    const uint64_t want = (size_expr), extra_bytes = (extra_expr);     \
    Guard guard(t);                                                    \
    if (!p || (g_sample_rate && !sampled_live((uint64_t)p))) return REAL(sym) args; \
    size_t got = 0;                                                    \
    uint64_t size = want;                                              \
    record_realloc(t, ID_##sym, p, size, true, true, MEMHOOK_HOOK_FRAME(), \
                   [&]() -> void* {                                    \
                     got = REAL(sym) args;                             \
                     if (got < want) return nullptr;                   \
                     size = got < want + extra_bytes ? got : want + extra_bytes; \
                     return p;                                         \
                   });                                                 \
    return got;                                                        \
  }

// The program's anonymous mappings: recorded in every mode (no sampling, no size filter: they
// are few and large), the mapping as an allocation of its page-rounded length, an unmap or a
// release as a range before the real call.
#define MAP(id, sym, name, params, args, len_expr, when_expr)          \
  extern "C" __attribute__((visibility("default"))) void* memhook_hook_##sym params { \
    PASS_THROUGH(sym, args)                                            \
    HookFrame fp = MEMHOOK_HOOK_FRAME();                               \
    if (!(when_expr)) return REAL(sym) args;                           \
    Guard guard(t);                                                    \
    void* result = REAL(sym) args;                                     \
    if (result != MAP_FAILED) record_alloc(t, ID_##sym, result, page_round(len_expr), \
                                           origin_of(fp));             \
    return result;                                                     \
  }
// An unmap orders against a mapping another thread then gets at that address (the address
// table); a release keeps the range, and orders against nothing.
#define RANGE_ENTRY(sym, ret, params, args, addr_expr, len_expr, when_expr, table) \
  extern "C" __attribute__((visibility("default"))) ret memhook_hook_##sym params { \
    PASS_THROUGH(sym, args)                                            \
    if (when_expr) {                                                   \
      Guard guard(t);                                                  \
      record_unmap(t, ID_##sym, (addr_expr), page_round(len_expr),     \
                   MEMHOOK_HOOK_FRAME(), table);                       \
    }                                                                  \
    return REAL(sym) args;                                             \
  }
#define UNMAP(id, sym, name, ret, params, args, addr_expr, len_expr, when_expr) \
  RANGE_ENTRY(sym, ret, params, args, addr_expr, len_expr, when_expr, true)
#define RELEASE(id, sym, name, ret, params, args, addr_expr, len_expr, when_expr) \
  RANGE_ENTRY(sym, ret, params, args, addr_expr, len_expr, when_expr, false)
// mremap: the old range unmapped before the call, the result mapped after it (the consumer
// maps it only where the old range was one of the program's anonymous mappings it knows). A
// call that failed maps the old range back, now under this call's stack.
#define REMAP(id, sym, name, params, args, addr_expr, old_expr, len_expr) \
  extern "C" __attribute__((visibility("default"))) void* memhook_hook_##sym params { \
    PASS_THROUGH(sym, args)                                            \
    HookFrame fp = MEMHOOK_HOOK_FRAME();                               \
    Guard guard(t);                                                    \
    record_unmap(t, ID_##sym, (addr_expr), page_round(old_expr), fp, true); \
    void* result = REAL(sym) args;                                     \
    if (result != MAP_FAILED)                                          \
      record_alloc(t, ID_##sym, result, page_round(len_expr), origin_of(fp)); \
    else                                                               \
      record_alloc(t, ID_##sym, (addr_expr), page_round(old_expr), origin_of(fp)); \
    return result;                                                     \
  }

#define LOADER(...)  // below, by hand
#include "hooks.def"

#if MEMHOOK_MALLOC_ENTRY
// memhook_hook_malloc's record when its own (malloc_entry.S) does not apply, with the origin
// as that entry found it (arch::entry_origin). That entry may have set the guard already (it does
// before it reads the cursor), and only this call's own: a nested call never comes here.
extern "C" __attribute__((visibility("hidden"), noinline, optimize("omit-frame-pointer"))) void*
memhook_record_malloc(void* p, uint64_t size, void** ret, void** frame, uint64_t sp) {
  if (mode() != kEvery) {  // memhook changed modes (or detached) since the entry looked
    // The guard cleared: left set, it would pass every later call of this thread through, in
    // every later session too (a thread stopped here while memhook detached: the spinner
    // test's sessions saw nothing after 20 to 150 attach/detach cycles).
    leave(t_state);
    return p;
  }
  return record_alloc_leaf<ID_malloc>(p, size, arch::entry_origin(ret, frame, sp));
}
#endif

// A library loaded later gets its slots patched at once (late_patching.h).
extern "C" __attribute__((visibility("default"))) void* memhook_hook_dlopen(const char* f, int m) {
  void* h = REAL(dlopen)(f, m);
  if (h && active()) {
    rescan_loaded();
    __atomic_fetch_add(&g_ctl->loads, 1, __ATOMIC_RELEASE);  // memhook builds its unwind rows
  }
  return h;
}

extern "C" __attribute__((visibility("default"))) int memhook_hook_dlclose(void* h) {
  int rc = REAL(dlclose)(h);
  if (active()) {
    forget_unloaded();
    __atomic_fetch_add(&g_ctl->loads, 1, __ATOMIC_RELEASE);
  }
  return rc;
}

// Each hook's entries by routing.h's Entry (none where a kind has no such entry), from which
// memhook_start picks what the slots of libraries loaded later get.
struct HookEntries {
  int id;
  char kind;
  void* entry[3];
};
const HookEntries kHookEntries[] = {
#define ALLOC(id, sym, ...) \
  {id, 'A', {(void*)&memhook_hook_##sym, (void*)&memhook_filter_##sym, (void*)&memhook_sample_##sym}},
#define FREE(id, sym, ...) {id, 'F', {(void*)&memhook_hook_##sym, nullptr, (void*)&memhook_sample_##sym}},
#define REALLOC(id, sym, ...) {id, 'R', {(void*)&memhook_hook_##sym}},
#define RESIZE(id, sym, ...) {id, 'R', {(void*)&memhook_hook_##sym}},
#define LOADER(id, sym, ...) {id, 'L', {(void*)&memhook_hook_##sym}},
#define MAP(id, sym, ...) {id, 'M', {(void*)&memhook_hook_##sym}},
#define UNMAP(id, sym, ...) {id, 'U', {(void*)&memhook_hook_##sym}},
#define RELEASE(id, sym, ...) {id, 'D', {(void*)&memhook_hook_##sym}},
#define REMAP(id, sym, ...) {id, 'X', {(void*)&memhook_hook_##sym}},
#define PROCESS(id, sym, ...) {id, 'P', {(void*)&memhook_hook_##sym}},
#include "hooks.def"
};
