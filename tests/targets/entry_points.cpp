// Every allocation entry point, each from its own function with its own size, N times.
#include <malloc.h>
#include <dlfcn.h>
#include <new>
#include "harness.h"

static const int N = 10;
static const std::align_val_t A64{64};
static void* volatile null_ptr = nullptr;  // keeps the compiler from turning realloc(NULL, n) into malloc

#define LEAK(name, expr) NOINLINE void name() { for (int i = 0; i < N; i++) { void* p = (expr); if (p) memset(p, 7, 1); } }
LEAK(leak_malloc, malloc(101))
LEAK(leak_calloc, calloc(3, 37))
LEAK(leak_realloc_null, realloc(null_ptr, 205))
LEAK(leak_reallocarray, reallocarray(null_ptr, 7, 31))
LEAK(leak_aligned_alloc, aligned_alloc(64, 256))
LEAK(leak_memalign, memalign(32, 223))
LEAK(leak_valloc, valloc(225))
LEAK(leak_pvalloc, pvalloc(227))
LEAK(leak_new, ::operator new(231))
LEAK(leak_new_array, ::operator new[](233))
LEAK(leak_new_nothrow, ::operator new(235, std::nothrow))
LEAK(leak_new_array_nothrow, ::operator new[](237, std::nothrow))
LEAK(leak_new_aligned, ::operator new(320, A64))
LEAK(leak_new_array_aligned, ::operator new[](384, A64))
LEAK(leak_new_aligned_nothrow, ::operator new(448, A64, std::nothrow))
LEAK(leak_new_array_aligned_nothrow, ::operator new[](512, A64, std::nothrow))
LEAK(leak_strdup, strdup("0123456789"))  // malloc called by libc through libc's own slot

NOINLINE void* grow_source() { return malloc(10); }
NOINLINE void leak_realloc_grow() { for (int i = 0; i < N; i++) realloc(grow_source(), 203); }
NOINLINE void* zero_source() { return malloc(207); }
NOINLINE void realloc_to_zero() { for (int i = 0; i < N; i++) realloc(zero_source(), 0); }
NOINLINE void leak_posix_memalign() {
  for (int i = 0; i < N; i++) { void* p; if (posix_memalign(&p, 64, 219) == 0) memset(p, 7, 1); }
}

// Allocated and freed through each release path: nothing outstanding.
#define FREED(name, alloc, release) NOINLINE void name() { for (int i = 0; i < N; i++) { void* p = (alloc); release; } }
FREED(freed_free, malloc(301), free(p))
FREED(freed_delete, ::operator new(303), ::operator delete(p))
FREED(freed_delete_array, ::operator new[](305), ::operator delete[](p))
FREED(freed_delete_sized, ::operator new(307), ::operator delete(p, 307))
FREED(freed_delete_array_sized, ::operator new[](309), ::operator delete[](p, 309))
FREED(freed_delete_aligned, ::operator new(576, A64), ::operator delete(p, A64))
FREED(freed_delete_array_aligned, ::operator new[](640, A64), ::operator delete[](p, A64))
FREED(freed_delete_sized_aligned, ::operator new(704, A64), ::operator delete(p, 704, A64))
FREED(freed_delete_array_sized_aligned, ::operator new[](768, A64), ::operator delete[](p, 768, A64))
FREED(freed_delete_nothrow, ::operator new(311), ::operator delete(p, std::nothrow))
FREED(freed_delete_array_nothrow, ::operator new[](313), ::operator delete[](p, std::nothrow))
FREED(freed_delete_aligned_nothrow, ::operator new(832, A64), ::operator delete(p, A64, std::nothrow))
FREED(freed_delete_array_aligned_nothrow, ::operator new[](896, A64), ::operator delete[](p, A64, std::nothrow))

// std::bad_alloc unwinds through the operator-new hook; tracing must carry on afterwards.
NOINLINE void throw_bad_alloc() {
  try { ::operator new(size_t(1) << 62); } catch (const std::bad_alloc&) {}
}
LEAK(leak_after_throw, ::operator new(239))

// A function-pointer table: an R_X86_64_64 slot (PIE) or a GLOB_DAT/absolute one (non-PIE).
void* (*volatile alloc_table[])(size_t) = {malloc};
LEAK(leak_through_table, alloc_table[0](241))

int main() {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "go")) {
      leak_malloc(); leak_calloc(); leak_realloc_null(); leak_reallocarray();
      leak_aligned_alloc(); leak_memalign(); leak_valloc(); leak_pvalloc();
      leak_new(); leak_new_array(); leak_new_nothrow(); leak_new_array_nothrow();
      leak_new_aligned(); leak_new_array_aligned(); leak_new_aligned_nothrow();
      leak_new_array_aligned_nothrow(); leak_strdup(); leak_realloc_grow(); realloc_to_zero();
      leak_posix_memalign();
      freed_free(); freed_delete(); freed_delete_array(); freed_delete_sized();
      freed_delete_array_sized(); freed_delete_aligned(); freed_delete_array_aligned();
      freed_delete_sized_aligned(); freed_delete_array_sized_aligned(); freed_delete_nothrow();
      freed_delete_array_nothrow(); freed_delete_aligned_nothrow();
      freed_delete_array_aligned_nothrow();
      throw_bad_alloc(); leak_after_throw(); leak_through_table();
    }
    harness_done();
  }
  return 0;
}
