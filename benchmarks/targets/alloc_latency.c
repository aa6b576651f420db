/* The thesis' allocation-latency test: N mallocs of one size, timed in batches of 1000 (the
 * batch is freed untimed, so memory stays bounded), median of rounds. Commands on stdin:
 * "run SIZE COUNT ROUNDS [DEPTH]" prints "ns PER_CALL", the mallocs made DEPTH frames below
 * main (default 0: directly from the timing loop); "exit". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BATCH 1000
static void* blocks[BATCH];

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

__attribute__((noinline)) static uint64_t timed_batch(size_t size) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < BATCH; i++) blocks[i] = malloc(size);
  uint64_t t = now_ns() - t0;
  for (int i = 0; i < BATCH; i++) free(blocks[i]);
  return t;
}

static double measure(size_t size, size_t count, size_t rounds) {
  double per[64];
  if (rounds > 64) rounds = 64;
  for (size_t r = 0; r < rounds; r++) {
    uint64_t total = 0;
    for (size_t done = 0; done < count; done += BATCH) total += timed_batch(size);
    per[r] = (double)total / (double)count;
  }
  qsort(per, rounds, sizeof *per, cmp);
  return per[rounds / 2];
}

/* DEPTH real frames (frame pointers, no tail calls) between main and the timing loop. */
__attribute__((noinline)) static double deep(int depth, size_t size, size_t count, size_t rounds) {
  double v = depth ? deep(depth - 1, size, count, rounds) : measure(size, count, rounds);
  __asm__ volatile("" ::: "memory");
  return v;
}

int main(void) {
  char line[128];
  printf("ready %d\n", getpid());
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    size_t size, count, rounds;
    int depth = 0;
    if (sscanf(line, "run %zu %zu %zu %d", &size, &count, &rounds, &depth) >= 3) {
      printf("ns %.2f\n", deep(depth, size, count, rounds));
    } else if (!strncmp(line, "exit", 4)) {
      break;
    }
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
