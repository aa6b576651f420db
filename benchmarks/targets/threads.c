/* Threads allocating and freeing concurrently: "run THREADS OPS" starts THREADS threads, each
 * doing OPS malloc/free pairs of 16..271 bytes over a private working set of 64 blocks, and
 * prints "mops TOTAL_MILLION_OPS_PER_SECOND" (wall clock, from first start to last finish). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long ops;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static void* worker(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void* live[64] = {0};
  for (long i = 0; i < ops; i++) {
    unsigned r = rand_r(&seed);
    free(live[r % 64]);
    live[r % 64] = malloc(16 + (r >> 8) % 256);
  }
  for (int i = 0; i < 64; i++) free(live[i]);
  return 0;
}

int main(void) {
  char line[128];
  printf("ready %d\n", getpid());
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    int n;
    if (sscanf(line, "run %d %ld", &n, &ops) == 2 && n > 0 && n <= 64) {
      pthread_t t[64];
      uint64_t t0 = now_ns();
      for (int i = 0; i < n; i++) pthread_create(&t[i], 0, worker, (void*)(uintptr_t)(i + 1));
      for (int i = 0; i < n; i++) pthread_join(t[i], 0);
      printf("mops %.3f\n", (double)n * ops / (double)(now_ns() - t0) * 1000.0);
    } else if (!strncmp(line, "exit", 4)) {
      break;
    }
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
