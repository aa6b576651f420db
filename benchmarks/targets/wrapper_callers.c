/* A program's own malloc wrapper (xmalloc, zmalloc) called from CALLERS places at one depth, in
 * turn: the wrapper's return address and stack pointer are the same for each, so their stacks
 * share one recent stack's key in memhook's hooks. Prints "ns PER_CALL" (the best of 2,000
 * batches of 1,000 calls, each batch freed untimed), for argv[1] callers (1-16). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((noinline)) void* xmalloc(size_t n) {
  void* p = malloc(n);
  __asm__ volatile("" ::: "memory");
  return p;
}

#define CALLER(k) \
  __attribute__((noinline)) void* caller##k(void) { \
    void* p = xmalloc(16); __asm__ volatile("" ::: "memory"); return p; }
CALLER(0) CALLER(1) CALLER(2) CALLER(3) CALLER(4) CALLER(5) CALLER(6) CALLER(7)
CALLER(8) CALLER(9) CALLER(10) CALLER(11) CALLER(12) CALLER(13) CALLER(14) CALLER(15)
static void* (*const callers[16])(void) = {caller0, caller1, caller2, caller3, caller4, caller5,
                                           caller6, caller7, caller8, caller9, caller10,
                                           caller11, caller12, caller13, caller14, caller15};

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 1;
  if (n < 1 || n > 16) return 2;
  static void* blocks[1000];
  double best = 1e9;
  for (int r = 0; r < 2000; r++) {
    const double t0 = now();
    for (int i = 0; i < 1000; i++) blocks[i] = callers[i % n]();
    const double t = now() - t0;
    if (t < best) best = t;
    for (int i = 0; i < 1000; i++) free(blocks[i]);
  }
  printf("ns %.2f\n", best / 1000 * 1e9);
  return 0;
}
