/* The thesis' allocation-latency test: N mallocs of one size, timed in batches of 1000 (the
 * batch is freed untimed, so memory stays bounded), median of rounds. Commands on stdin:
 * "run SIZE COUNT ROUNDS [DEPTH]" prints "ns PER_CALL", the mallocs made DEPTH frames below
 * main (default 0: directly from the timing loop); "pair SIZE COUNT ROUNDS [DEPTH]" does the
 * same through the GOT and, alternating batch by batch, through pointers to the real functions
 * taken at start-up (never hooked), and prints "bare PER_CALL" and "ns PER_CALL"; "exit".
 * Build with -fno-plt, so that both are indirect calls through memory. */
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

/* The real functions, read from the GOT before any attach: calls through these pointers are
 * never hooked (memhook patches slots, not copies). */
static void* (*volatile bare_malloc)(size_t);
static void (*volatile bare_free)(void*);

__attribute__((noinline)) static uint64_t bare_batch(size_t size) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < BATCH; i++) blocks[i] = bare_malloc(size);
  uint64_t t = now_ns() - t0;
  for (int i = 0; i < BATCH; i++) bare_free(blocks[i]);
  return t;
}

/* Batches alternate between the GOT path and the bare pointers: both see the same machine at
 * the same moment. Returns the median round through the GOT, that of the bare calls in
 * *bare_ns. */
static double bare_ns;
static double pair(size_t size, size_t count, size_t rounds) {
  double hb[64], bb[64];
  if (rounds > 64) rounds = 64;
  for (size_t r = 0; r < rounds; r++) {
    uint64_t th = 0, tb = 0;
    for (size_t done = 0; done < count; done += BATCH) {
      tb += bare_batch(size);
      th += timed_batch(size);
    }
    hb[r] = (double)th / (double)count;
    bb[r] = (double)tb / (double)count;
  }
  qsort(hb, rounds, sizeof *hb, cmp);
  qsort(bb, rounds, sizeof *bb, cmp);
  bare_ns = bb[rounds / 2];
  return hb[rounds / 2];
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
__attribute__((noinline)) static double deep(int depth, int paired, size_t size, size_t count,
                                             size_t rounds) {
  double v = depth ? deep(depth - 1, paired, size, count, rounds)
                   : paired ? pair(size, count, rounds) : measure(size, count, rounds);
  __asm__ volatile("" ::: "memory");
  return v;
}

int main(void) {
  char line[128];
  bare_malloc = malloc;
  bare_free = free;
  printf("ready %d\n", getpid());
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    size_t size, count, rounds;
    int depth = 0;
    if (sscanf(line, "run %zu %zu %zu %d", &size, &count, &rounds, &depth) >= 3) {
      printf("ns %.2f\n", deep(depth, 0, size, count, rounds));
    } else if (sscanf(line, "pair %zu %zu %zu %d", &size, &count, &rounds, &depth) >= 3) {
      double ns = deep(depth, 1, size, count, rounds);
      printf("bare %.2f\nns %.2f\n", bare_ns, ns);
    } else if (!strncmp(line, "exit", 4)) {
      break;
    }
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
