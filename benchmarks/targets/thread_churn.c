/* The program of issue 43's comparison with heaptrack: THREADS threads (argv[1], 400), each
 * making OPS allocations (argv[2], 1001) of 16..271 bytes and then freeing them all; prints its
 * own time on stderr ("thread_churn: SECONDS s"). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long ops;

static void* worker(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void** blocks = malloc(ops * sizeof(void*));
  for (long i = 0; i < ops; i++) blocks[i] = malloc(16 + rand_r(&seed) % 256);
  for (long i = 0; i < ops; i++) free(blocks[i]);
  free(blocks);
  return 0;
}

int main(int argc, char** argv) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int n = argc > 1 ? atoi(argv[1]) : 400;
  ops = argc > 2 ? atol(argv[2]) - 1 : 1000;  /* the block array is the 1,001st */
  pthread_t* t = malloc(n * sizeof(pthread_t));
  for (int i = 0; i < n; i++) pthread_create(&t[i], 0, worker, (void*)(uintptr_t)(i + 1));
  for (int i = 0; i < n; i++) pthread_join(t[i], 0);
  free(t);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  /* The program's own time, as it measures it, whatever runs it. */
  fprintf(stderr, "thread_churn: %.4f s\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
  return 0;
}
