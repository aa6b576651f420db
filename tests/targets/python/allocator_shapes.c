/* What the allocator-struct finder (memhook/inject/python_interpreter.py) reads: CPython's
 * PyObject_Malloc calls through a PyMemAllocatorEx inside _PyRuntime. Built by
 * tests/unit/test_allocator_struct.py for x86-64 and AArch64, as a shared library (_PyRuntime
 * reached through the GOT) and as an executable (reached directly). */
#include <stddef.h>
#include <stdint.h>

typedef struct {
  void* ctx;
  void* (*malloc)(void*, size_t);
  void* (*calloc)(void*, size_t, size_t);
  void* (*realloc)(void*, void*, size_t);
  void (*free)(void*, void*);
} PyMemAllocatorEx;

static char arena[1 << 12];
static void* raw_malloc(void* ctx, size_t n) { return n < sizeof arena ? arena : (void*)ctx; }
static void* raw_calloc(void* ctx, size_t n, size_t k) { return raw_malloc(ctx, n * k); }
static void* raw_realloc(void* ctx, void* p, size_t n) { return p ? p : raw_malloc(ctx, n); }
static void raw_free(void* ctx, void* p) { arena[0] = ctx == p; }

struct runtime {
  uint64_t before[5];
  PyMemAllocatorEx mem, obj;
} _PyRuntime = {{0}, {0, raw_malloc, raw_calloc, raw_realloc, raw_free},
                {0, raw_malloc, raw_calloc, raw_realloc, raw_free}};

void* PyObject_Malloc(size_t n) {
  if (n > (size_t)INT64_MAX) return 0;
  return _PyRuntime.obj.malloc(_PyRuntime.obj.ctx, n);
}

int main(void) { return PyObject_Malloc(16) == 0; }
