// Loads the hook library into this process (no GDB, no memhook), arms it on a segment the test
// formatted in sampling mode, and calls memhook_sample_malloc COUNT times for SIZE bytes each,
// so that the test can count the allocations the sampler chose in the ring.
//   sampler_harness LIBRARY SEGMENT COUNT SIZE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "segment.h"

int main(int argc, char** argv) {
  if (argc != 5) return 2;
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
  auto sample_malloc = (void* (*)(size_t))dlsym(lib, "memhook_sample_malloc");
  printf("start %d\n", start(argv[2]));
  const long count = atol(argv[3]);
  const size_t size = (size_t)atol(argv[4]);
  long returned = 0;
  for (long i = 0; i < count; i++) returned += sample_malloc(size) != nullptr;
  printf("returned %ld\n", returned);
  fflush(stdout);
  return 0;
}
