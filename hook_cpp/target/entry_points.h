// The entry points GOT slots are pointed at, one set per hooked function (hooks.def): each calls
// the real function and has the record written (records.h). memhook_hook_malloc, the hottest,
// is hand-written (malloc_entry).
#pragma once

// Exceptions (std::bad_alloc) unwind through the operator-new hooks and must reset the
// recursion guard. The personality routine lives in libstdc++, which is loaded wherever
// operator new is; a weak reference keeps C targets free of libstdc++.
asm(".weak __gxx_personality_v0");

namespace {
inline uint64_t page_round(uint64_t n) { return (n + 4095) & ~uint64_t(4095); }
}  // namespace

#define PASS_THROUGH(sym, args)                                        \
  ThreadState& t = t_state;                                            \
  if (__builtin_expect(!active() || t.in_hook, 0)) return REAL(sym) args;

#define UNPAREN(...) __VA_ARGS__

// Allocation hooks. memhook_hook_* records (or, when memhook is inactive, the call nested,
// filtered out or not sampled, passes straight to the real function); the backtrace starts at
// its call site. Full tracing takes the short path in the compiled hook (framed_*) itself, whose
// frame sits directly below the caller's; everything else (a size filter, sampling, operator
// new, nested or inactive calls) goes to general_*, which walks from the hook's frame all the
// same (a sibling call reuses it).
// Sampling sessions point slots at memhook_sample_* instead: it counts the thread's countdown
// down and tail-calls the real function while no sample is due (a few instructions, no frame
// of its own), else tail-calls framed_*. Sessions with a size filter point them at
// memhook_filter_*, the compiled hook itself.
// memhook_hook_* (every call) is the compiled hook itself (framed_*), or for malloc, the hottest
// of them, an assembly entry below that records every call, and falls back to it.
#define FRAMED_ENTRY(sym, ret, params)                                 \
  extern "C" __attribute__((visibility("default"), alias("framed_" #sym))) ret \
  memhook_hook_##sym params;
#define ASM_ENTRY(sym, ret, params) extern "C" ret memhook_hook_##sym params;
#define HOOK_A(...) HOOK_A_WITH(FRAMED_ENTRY, __VA_ARGS__)

#define HOOK_A_WITH(ENTRY, sym, ret, params, args, size_expr, result_ptr) \
  __attribute__((noinline)) static ret general_##sym(void** fp, UNPAREN params) { \
    ThreadState& t = t_state;                                          \
    const uint64_t size = (size_expr);                                 \
    const int m = mode();                                              \
    if (m == kOff || t.in_hook || (m == kSelective && !chosen_slow(t, size))) { \
      if (!kNests[ID_##sym]) return REAL(sym) args;                    \
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
  extern "C" __attribute__((visibility("hidden"))) ret framed_##sym params { \
    ThreadState& t = t_state;                                          \
    void** fp = (void**)__builtin_frame_address(0);                    \
    /* operator new keeps the guard across its inner malloc: general_* */ \
    if (__builtin_expect(mode() != kEvery || t.in_hook, 0) || kNests[ID_##sym]) \
      return general_##sym(fp, UNPAREN args);                          \
    const uint64_t size = (size_expr);                                 \
    ret result = REAL(sym) args;                                       \
    /* fp read again: held across the call it would cost a register */ \
    if (void* p = (result_ptr))                                        \
      record_alloc_now<ID_##sym>(p, size, origin_of((void**)__builtin_frame_address(0))); \
    return result;                                                     \
  }                                                                    \
  ENTRY(sym, ret, params)                                              \
  /* 64-byte aligned: straddling a line cost it 0.03x at 16 B */      \
  extern "C" __attribute__((visibility("default"), optimize("omit-frame-pointer"), \
                            aligned(64))) ret                          \
  memhook_sample_##sym params {                                        \
    ThreadState& t = t_state;                                          \
    if (__builtin_expect(count_down(t, (size_expr)), 1)) {             \
      if (!kNests[ID_##sym]) return REAL(sym) args;                    \
      Guard guard(t); /* its inner malloc is this call, not another */ \
      return REAL(sym) args;                                           \
    }                                                                  \
    return framed_##sym args;                                          \
  }                                                                    \
  extern "C" __attribute__((visibility("default"), alias("framed_" #sym))) ret \
  memhook_filter_##sym params;

// Frees are recorded before the real call. In sampling mode only frees of sampled blocks are
// recorded (sampled_live says which), and the sampling entry (memhook_sample_*) passes every
// other free straight to the real function. Plain free calls nothing hooked: on its short path
// the guard ends before it, and it is a tail call.
#define HOOK_F(sym, ret, params, args)                                 \
  __attribute__((noinline)) static ret general_##sym(void** fp, UNPAREN params) { \
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
  extern "C" __attribute__((visibility("default"))) ret memhook_hook_##sym params { \
    ThreadState& t = t_state;                                          \
    void** fp = (void**)__builtin_frame_address(0);                    \
    /* operator delete keeps the guard across its inner free: general_* */ \
    if (__builtin_expect(!p || mode() != kEvery || t.in_hook, 0) || ID_##sym != ID_free) \
      return general_##sym(fp, UNPAREN args);                          \
    enter(t);                                                          \
    record_free(t, ID_##sym, p, fp);                                   \
    leave(t);                                                          \
    return REAL(sym) args;                                             \
  }                                                                    \
  extern "C" __attribute__((visibility("default"), optimize("omit-frame-pointer"))) ret \
  memhook_sample_##sym params {                                        \
    if (!p || !sampled_live((uint64_t)p)) return REAL(sym) args;       \
    return memhook_hook_##sym args;                                    \
  }

HOOK_A_WITH(ASM_ENTRY, malloc, void*, (size_t n), (n), n, result)
HOOK_A(calloc, void*, (size_t c, size_t n), (c, n), c * n, result)
HOOK_A(aligned_alloc, void*, (size_t a, size_t n), (a, n), n, result)
HOOK_A(memalign, void*, (size_t a, size_t n), (a, n), n, result)
HOOK_A(valloc, void*, (size_t n), (n), n, result)
HOOK_A(pvalloc, void*, (size_t n), (n), page_round(n), result)
HOOK_A(posix_memalign, int, (void** out, size_t a, size_t n), (out, a, n), n,
       result == 0 ? *out : nullptr)
HOOK_A(_Znwm, void*, (size_t n), (n), n, result)
HOOK_A(_Znam, void*, (size_t n), (n), n, result)
HOOK_A(_ZnwmRKSt9nothrow_t, void*, (size_t n, const void* tag), (n, tag), n, result)
HOOK_A(_ZnamRKSt9nothrow_t, void*, (size_t n, const void* tag), (n, tag), n, result)
HOOK_A(_ZnwmSt11align_val_t, void*, (size_t n, size_t a), (n, a), n, result)
HOOK_A(_ZnamSt11align_val_t, void*, (size_t n, size_t a), (n, a), n, result)
HOOK_A(_ZnwmSt11align_val_tRKSt9nothrow_t, void*, (size_t n, size_t a, const void* tag),
       (n, a, tag), n, result)
HOOK_A(_ZnamSt11align_val_tRKSt9nothrow_t, void*, (size_t n, size_t a, const void* tag),
       (n, a, tag), n, result)

// memhook_hook_malloc's record when its own (below) does not apply, with the origin as that
// entry found it.
extern "C" __attribute__((visibility("hidden"), noinline, optimize("omit-frame-pointer"))) void*
memhook_record_malloc(void* p, uint64_t size, void** ret, void** frame) {
  if (mode() != kEvery) return p;  // a call that entered as memhook changed modes (or detached)
  return record_alloc_leaf<ID_malloc>(p, size, Origin{ret, frame});
}

HOOK_F(free, void, (void* p), (p))
HOOK_F(_ZdlPv, void, (void* p), (p))
HOOK_F(_ZdaPv, void, (void* p), (p))
HOOK_F(_ZdlPvm, void, (void* p, size_t n), (p, n))
HOOK_F(_ZdaPvm, void, (void* p, size_t n), (p, n))
HOOK_F(_ZdlPvSt11align_val_t, void, (void* p, size_t a), (p, a))
HOOK_F(_ZdaPvSt11align_val_t, void, (void* p, size_t a), (p, a))
HOOK_F(_ZdlPvmSt11align_val_t, void, (void* p, size_t n, size_t a), (p, n, a))
HOOK_F(_ZdaPvmSt11align_val_t, void, (void* p, size_t n, size_t a), (p, n, a))
HOOK_F(_ZdlPvRKSt9nothrow_t, void, (void* p, const void* tag), (p, tag))
HOOK_F(_ZdaPvRKSt9nothrow_t, void, (void* p, const void* tag), (p, tag))
HOOK_F(_ZdlPvSt11align_val_tRKSt9nothrow_t, void, (void* p, size_t a, const void* tag),
       (p, a, tag))
HOOK_F(_ZdaPvSt11align_val_tRKSt9nothrow_t, void, (void* p, size_t a, const void* tag),
       (p, a, tag))


static void* call_realloc(void* p, uint64_t n, uint64_t) { return REAL(realloc)(p, n); }
static void* call_reallocarray(void* p, uint64_t c, uint64_t n) { return REAL(reallocarray)(p, c, n); }

#define HOOK_R(sym, params, args, size_expr, a1, a2)                   \
  extern "C" __attribute__((visibility("default"))) void* memhook_hook_##sym params { \
    PASS_THROUGH(sym, args)                                            \
    uint64_t size = (size_expr);                                       \
    bool track_old = p && (!g_sample_rate || sampled_live((uint64_t)p)); \
    bool track_new = !g_selective || chosen(t, size);                  \
    if (!track_old && !track_new) return REAL(sym) args;               \
    t.in_hook = 1;                                                     \
    void* result = record_realloc(t, ID_##sym, p, size, track_old, track_new, \
                                  (void**)__builtin_frame_address(0), call_##sym, a1, a2); \
    t.in_hook = 0;                                                     \
    return result;                                                     \
  }

HOOK_R(realloc, (void* p, size_t n), (p, n), n, n, 0)
HOOK_R(reallocarray, (void* p, size_t c, size_t n), (p, c, n), c * n, c, n)

extern "C" __attribute__((visibility("default"))) void* memhook_hook_dlopen(const char* f, int m) {
  void* h = REAL(dlopen)(f, m);
  if (h && active()) rescan_loaded();
  return h;
}

extern "C" __attribute__((visibility("default"))) int memhook_hook_dlclose(void* h) {
  int rc = REAL(dlclose)(h);
  if (active()) forget_unloaded();
  return rc;
}
