/* A target on a busy host: one thread per core allocates and frees at full speed (8 to 520
 * bytes, a window of 256 live blocks each, through 16 call stacks). "stop" has every thread
 * free what it holds and wait; from then on nothing of theirs is live. "leak" leaks 100 blocks
 * of 1,000 bytes from the main thread; "exit" ends. */
#include <pthread.h>
#include <stdint.h>
#include "harness.h"

#define WINDOW 256
static volatile int stopping;
static int parked;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_parked = PTHREAD_COND_INITIALIZER;
static int nthreads;

#define LEAF(n) NOINLINE static void* churn##n(size_t s) { \
    void* p = malloc(s); __asm__ volatile("" ::: "memory"); return p; }
LEAF(0) LEAF(1) LEAF(2) LEAF(3) LEAF(4) LEAF(5) LEAF(6) LEAF(7)
LEAF(8) LEAF(9) LEAF(10) LEAF(11) LEAF(12) LEAF(13) LEAF(14) LEAF(15)
static void* (*leaves[16])(size_t) = {churn0, churn1, churn2, churn3, churn4, churn5, churn6,
                                      churn7, churn8, churn9, churn10, churn11, churn12,
                                      churn13, churn14, churn15};

static void* worker(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void* live[WINDOW] = {0};
  while (!stopping) {
    unsigned r = rand_r(&seed);
    int slot = r % WINDOW;
    free(live[slot]);
    live[slot] = leaves[(r >> 8) % 16](8 + (r >> 12) % 513);
  }
  for (int i = 0; i < WINDOW; i++) free(live[i]);
  pthread_mutex_lock(&lock);
  parked++;
  pthread_cond_broadcast(&all_parked);
  pthread_mutex_unlock(&lock);
  return 0;
}

NOINLINE static void leak(void) { for (int i = 0; i < 100; i++) memset(malloc(1000), 1, 1000); }

int main(void) {
  char cmd[64];
  nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  pthread_t t;
  for (uintptr_t i = 1; i <= (uintptr_t)nthreads; i++) pthread_create(&t, 0, worker, (void*)i);
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "stop")) {
      stopping = 1;
      pthread_mutex_lock(&lock);
      while (parked < nthreads) pthread_cond_wait(&all_parked, &lock);
      pthread_mutex_unlock(&lock);
    } else if (!strcmp(cmd, "leak")) {
      leak();
    }
    harness_done();
  }
  return 0;
}
