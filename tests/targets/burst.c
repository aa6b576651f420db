/* Bursts of allocations: "burst T N [K]" has T threads (started for the burst) each make N
 * allocations of 32 bytes through burst_alloc as fast as they can, freeing each at once but
 * every Kth (default 1000), which it keeps: T * N allocations, T * (N / K) blocks outstanding.
 * K = 1 keeps every block (a burst that fills the consumer's live map). */
#include <pthread.h>
#include <stdint.h>
#include "harness.h"

static long per_thread, keep_every;

NOINLINE static void* burst_alloc(void) {
  void* p = malloc(32);
  __asm__ volatile("" ::: "memory");
  return p;
}

static void* burst(void* arg) {
  (void)arg;
  for (long i = 1; i <= per_thread; i++) {
    void* p = burst_alloc();
    if (i % keep_every) free(p);
  }
  return 0;
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    int threads = 0;
    keep_every = 1000;
    if (sscanf(cmd, "burst %d %ld %ld", &threads, &per_thread, &keep_every) >= 2 &&
        threads > 0 && keep_every > 0) {
      pthread_t t[256];
      if (threads > 256) threads = 256;
      for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, burst, 0);
      for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    }
    harness_done();
  }
  return 0;
}
