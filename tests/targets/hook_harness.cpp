// Loads the hook library into this process, with no GDB and no memhook, arms it on a segment
// the test formatted, and calls its entry points directly, so that the test can read the very
// records memhook_hook_malloc and memhook_hook_free wrote. Prints what it did, one line each.
//   hook_harness LIBRARY SEGMENT
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "segment.h"

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
  // What memhook's attach would have written: the real functions and the target's pid.
  int fd = open(argv[2], O_RDWR);
  auto* c = (memhook::Control*)mmap(nullptr, sizeof(memhook::Control), PROT_READ | PROT_WRITE,
                                    MAP_SHARED, fd, 0);
  if (c == MAP_FAILED) return 3;
  c->real[1] = (uint64_t)&malloc;  // hooks.def ids
  c->real[18] = (uint64_t)&free;
  c->target_pid = (uint64_t)getpid();
  munmap(c, sizeof(memhook::Control));
  close(fd);
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    printf("dlopen %s\n", dlerror());
    return 4;
  }
  auto start = (int (*)(const char*))dlsym(lib, "memhook_start");
  hook_malloc = (Malloc)dlsym(lib, "memhook_hook_malloc");
  auto hook_free = (Free)dlsym(lib, "memhook_hook_free");
  printf("leaf %#lx\nstart %d\n", (unsigned long)(void*)&leaf, start(argv[2]));
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
