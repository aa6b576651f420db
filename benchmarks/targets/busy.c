/* A busy process for capture-size and long-session measurements: threads (argv[1], default 2)
 * allocate and free continuously from about 2,000 distinct call stacks (40 leaf functions x
 * recursion depths 1..50), keeping a bounded working set and leaking one block in a thousand,
 * resting 100 us every argv[2] (default 256) allocations. "ready" then runs until killed. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LIVE 4096
#define LEAF(n) __attribute__((noinline)) static void* leaf##n(size_t s) { \
    void* p = malloc(s + n); __asm__ volatile("" ::: "memory"); return p; }
#define L4(n) LEAF(n##0) LEAF(n##1) LEAF(n##2) LEAF(n##3)
L4(1) L4(2) L4(3) L4(4) L4(5) L4(6) L4(7) L4(8) L4(9) L4(10)
#define R4(n) leaf##n##0, leaf##n##1, leaf##n##2, leaf##n##3
static void* (*leaves[40])(size_t) = {R4(1), R4(2), R4(3), R4(4), R4(5), R4(6), R4(7), R4(8),
                                      R4(9), R4(10)};

__attribute__((noinline)) static void* descend(int depth, int leaf, size_t size) {
  void* p = depth ? descend(depth - 1, leaf, size) : leaves[leaf](size);
  __asm__ volatile("" ::: "memory");
  return p;
}

static unsigned long burst = 256;

static void* worker(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void* live[LIVE] = {0};
  for (unsigned long i = 0;; i++) {
    unsigned r = rand_r(&seed);
    int slot = r % LIVE;
    if (live[slot] && r % 1000) free(live[slot]);  /* one in a thousand leaks */
    live[slot] = descend(1 + r % 50, (r >> 8) % 40, 16 + (r >> 16) % 512);
    if (i % burst == 0) usleep(100);
  }
  return 0;
}

int main(int argc, char** argv) {
  pthread_t t;
  uintptr_t threads = argc > 1 ? strtoul(argv[1], 0, 10) : 2;
  if (argc > 2) burst = strtoul(argv[2], 0, 10);
  for (uintptr_t i = 1; i <= threads; i++) pthread_create(&t, 0, worker, (void*)i);
  printf("ready %d\n", getpid());
  fflush(stdout);
  pause();
  return 0;
}
