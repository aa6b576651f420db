/* Bursts of allocations: "burst T N" has T threads (started for the burst) each make N
 * allocations of 32 bytes through burst_alloc as fast as they can, freeing each at once but
 * every 1000th, which it keeps: T * N allocations, T * (N / 1000) blocks outstanding. */
#include <pthread.h>
#include <stdint.h>
#include "harness.h"

static long per_thread;

NOINLINE static void* burst_alloc(void) {
  void* p = malloc(32);
  __asm__ volatile("" ::: "memory");
  return p;
}

static void* burst(void* arg) {
  (void)arg;
  for (long i = 1; i <= per_thread; i++) {
    void* p = burst_alloc();
    if (i % 1000) free(p);
  }
  return 0;
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    int threads = 0;
    if (sscanf(cmd, "burst %d %ld", &threads, &per_thread) == 2 && threads > 0) {
      pthread_t t[256];
      if (threads > 256) threads = 256;
      for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, burst, 0);
      for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    }
    harness_done();
  }
  return 0;
}
