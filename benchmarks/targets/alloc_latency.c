/* The thesis' allocation-latency test: N mallocs of one size, timed in batches of 1000 (the
 * batch is freed untimed, so memory stays bounded), median of rounds. Size 0 is churn instead:
 * each call frees one of 64 live blocks picked at random and allocates 16..271 bytes in its
 * place, so frees are timed too. Commands on stdin:
 * "run SIZE COUNT ROUNDS [DEPTH]" prints "ns PER_CALL", the mallocs made DEPTH frames below
 * main (default 0: directly from the timing loop); "pair SIZE COUNT ROUNDS [DEPTH]" does the
 * same through the GOT and, alternating batch by batch, through copies of the real functions'
 * addresses taken at start-up (never hooked), and prints "bare PER_CALL" and "ns PER_CALL";
 * "exit". Build with -fno-plt. */
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

/* Churn: a free and a malloc per call over 64 live blocks (both timed), the same pattern as
 * the thread benchmark's workers. */
static void* live[64];
static unsigned seed = 1;
__attribute__((noinline)) static uint64_t churn_batch(void* (*m)(size_t), void (*f)(void*)) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < BATCH; i++) {
    unsigned r = rand_r(&seed);
    f(live[r % 64]);
    live[r % 64] = m(16 + (r >> 8) % 256);
  }
  return now_ns() - t0;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* One batch through the given functions. Called with `malloc` and `free` (built with
 * -fno-plt, naming them reads their GOT slots, which memhook patches) or with copies of them
 * taken before any attach (never hooked): the same loop either way. */
__attribute__((noinline)) static uint64_t timed_batch(void* (*m)(size_t), void (*f)(void*),
                                                      size_t size) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < BATCH; i++) blocks[i] = m(size);
  uint64_t t = now_ns() - t0;
  for (int i = 0; i < BATCH; i++) f(blocks[i]);
  return t;
}

static uint64_t batch(void* (*m)(size_t), void (*f)(void*), size_t size) {
  return size ? timed_batch(m, f, size) : churn_batch(m, f);
}

static void* (*volatile bare_malloc)(size_t);
static void (*volatile bare_free)(void*);

/* Batches alternate between the GOT path and the bare pointers: both see the same machine at
 * the same moment. Returns the median batch through the GOT (ns per call), that of the bare
 * batches in bare_ns: medians of batches, so that the rare batch the scheduler interrupts (two
 * vCPUs shared with memhook's consumer) counts for neither. */
#define MAX_BATCHES 4096
static double bare_ns, hooked_per[MAX_BATCHES], bare_per[MAX_BATCHES];
static double pair(size_t size, size_t count, size_t rounds) {
  size_t n = 0;
  for (size_t r = 0; r < rounds; r++) {
    for (size_t done = 0; done < count && n < MAX_BATCHES; done += BATCH, n++) {
      if (n & 1) { /* each goes first half the time */
        bare_per[n] = (double)batch(bare_malloc, bare_free, size) / BATCH;
        hooked_per[n] = (double)batch(malloc, free, size) / BATCH;
      } else {
        hooked_per[n] = (double)batch(malloc, free, size) / BATCH;
        bare_per[n] = (double)batch(bare_malloc, bare_free, size) / BATCH;
      }
    }
  }
  qsort(hooked_per, n, sizeof *hooked_per, cmp);
  qsort(bare_per, n, sizeof *bare_per, cmp);
  bare_ns = bare_per[n / 2];
  return hooked_per[n / 2];
}

static double measure(size_t size, size_t count, size_t rounds) {
  double per[64];
  if (rounds > 64) rounds = 64;
  for (size_t r = 0; r < rounds; r++) {
    uint64_t total = 0;
    for (size_t done = 0; done < count; done += BATCH) total += batch(malloc, free, size);
    per[r] = (double)total / (double)count;
  }
  qsort(per, rounds, sizeof *per, cmp);
  return per[rounds / 2];
}

/* DEPTH real frames (no tail calls) between main and the timing loop. */
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
