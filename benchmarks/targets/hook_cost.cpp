// The malloc hook's own cost: the hook library loaded into this process (no GDB, no memhook, no
// consumer), batches of 16-byte mallocs through memhook_hook_malloc alternating with batches
// through malloc itself, from the same loop. Between batches the harness frees the blocks (through
// the real free, unrecorded) and empties the ring as an instant consumer would.
//   hook_cost LIBRARY SEGMENT BATCHES
// Prints "bare NS", "hooked NS" (medians per call) and "dropped N".
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "segment.h"

using Malloc = void* (*)(size_t);
constexpr int kBatch = 1000;

static double now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// One batch through `f`, ns per call; the blocks freed afterwards, untimed.
__attribute__((noinline)) static double batch(Malloc f, void** blocks) {
  const double t0 = now_ns();
  for (int i = 0; i < kBatch; i++) blocks[i] = f(16);
  const double ns = (now_ns() - t0) / kBatch;
  for (int i = 0; i < kBatch; i++) free(blocks[i]);
  return ns;
}

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const int batches = atoi(argv[3]);
  int fd = open(argv[2], O_RDWR);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) return 3;
  auto* seg = (uint8_t*)mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (seg == MAP_FAILED) return 3;
  auto* c = (memhook::Control*)seg;
  c->real[1] = (uint64_t)&malloc;  // hooks.def ids: what memhook's attach would write
  c->real[18] = (uint64_t)&free;
  c->target_pid = (uint64_t)getpid();
  auto* ring = (memhook::RingHeader*)(seg + memhook::rings_offset());
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) return 4;
  auto start = (int (*)(const char*))dlsym(lib, "memhook_start");
  auto hook = (Malloc)dlsym(lib, "memhook_hook_malloc");
  if (!start || !hook || start(argv[2]) != 0) return 5;
  std::vector<void*> blocks(kBatch);
  std::vector<double> bare, hooked;
  for (int b = 0; b < batches; b++) {
    bare.push_back(batch(&malloc, blocks.data()));
    hooked.push_back(batch(hook, blocks.data()));
    __atomic_store_n(&ring->read, __atomic_load_n(&ring->write, __ATOMIC_ACQUIRE),
                     __ATOMIC_RELEASE);  // consumed
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  printf("bare %.3f\nhooked %.3f\ndropped %lu\n", median(bare), median(hooked),
         (unsigned long)ring->dropped);
  return 0;
}
