// Loads the hook library into this process (no GDB, no memhook), arms it on a segment the test
// formatted in sampling mode, and calls memhook_sample_malloc COUNT times for SIZE bytes each,
// so that the test can count the allocations the sampler chose in the ring.
//   sampler_harness LIBRARY SEGMENT COUNT SIZE
#include "load_hook_library.h"

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  void* lib = load_hook_library(argv[1], argv[2]);
  if (!lib) return 4;
  auto sample_malloc = (void* (*)(size_t))dlsym(lib, "memhook_sample_malloc");
  const long count = atol(argv[3]);
  const size_t size = (size_t)atol(argv[4]);
  long returned = 0;
  for (long i = 0; i < count; i++) returned += sample_malloc(size) != nullptr;
  printf("returned %ld\n", returned);
  fflush(stdout);
  return 0;
}
