/* Threads' first events (issue 43): "start N" starts N threads; each makes one malloc, then
 * waits until all N have, so that all N stacks are mapped at once, as a thread pool's are.
 * Answers "us_per_thread X": from the first pthread_create until the last thread's malloc
 * returned, per thread. Under memhook each malloc is its thread's first event (a ring claimed,
 * its stack's bounds found). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_barrier_t all_allocated;
static void* volatile kept[4096];

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void* worker(void* arg) {
  kept[(size_t)arg] = malloc(64);
  pthread_barrier_wait(&all_allocated);  /* one of them returns last: after every malloc */
  pthread_barrier_wait(&all_allocated);  /* main has read the time */
  free(kept[(size_t)arg]);
  return NULL;
}

int main(void) {
  char line[64];
  printf("ready\n");
  fflush(stdout);
  while (fgets(line, sizeof line, stdin) && strncmp(line, "exit", 4)) {
    int n = 0;
    if (sscanf(line, "start %d", &n) == 1 && n > 0 && n <= 4096) {
      static pthread_t t[4096];
      pthread_barrier_init(&all_allocated, NULL, n + 1);
      const double t0 = now_us();
      for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, worker, (void*)(size_t)i);
      pthread_barrier_wait(&all_allocated);
      printf("us_per_thread %.2f\n", (now_us() - t0) / n);
      pthread_barrier_wait(&all_allocated);
      for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
      pthread_barrier_destroy(&all_allocated);
    }
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
