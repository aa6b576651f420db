// Loads the hook library into this process, with no GDB and no memhook, arms it on a segment
// the test formatted, and calls its entry points directly, so that the test can read the very
// records memhook_hook_malloc and memhook_hook_free wrote. Prints what it did, one line each.
//   hook_harness LIBRARY SEGMENT
#include "load_hook_library.h"

using Malloc = void* (*)(size_t);
using Free = void (*)(void*);
static Malloc hook_malloc;

// Two frames of its own (frame pointers kept), so that the walk's frames can be checked.
__attribute__((noinline)) static void* leaf(size_t n) {
  void* p = hook_malloc(n);
  printf("leaf_ret %#lx\n", (unsigned long)__builtin_return_address(0));
  return p;
}
__attribute__((noinline)) static void* mid(size_t n) {
  void* p = leaf(n);
  printf("mid_ret %#lx\n", (unsigned long)__builtin_return_address(0));
  return p;
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  printf("leaf %#lx\n", (unsigned long)(void*)&leaf);
  void* lib = load_hook_library(argv[1], argv[2]);
  if (!lib) return 4;
  hook_malloc = (Malloc)dlsym(lib, "memhook_hook_malloc");
  auto hook_free = (Free)dlsym(lib, "memhook_hook_free");
  // From one call site: the first is walked (frames in its record, the stack kept in a slot),
  // the second repeats that stack (memhook_hook_malloc's own 3-word record), the third gets
  // the second's block back from the allocator after its free, so it depends on that free.
  void* p[3];
  for (int i = 0; i < 3; i++) {
    p[i] = mid(16);
    if (i == 1) hook_free(p[1]);
  }
  printf("ptrs %#lx %#lx %#lx\n", (unsigned long)p[0], (unsigned long)p[1], (unsigned long)p[2]);
  fflush(stdout);
  return 0;
}
