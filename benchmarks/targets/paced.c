/* Allocation at a set pace: "pace CALLS_PER_SECOND SECONDS" makes malloc/free pairs (a pair is
 * two calls) from 16 call sites at that rate, or as close as the thread can, and prints
 * "achieved CALLS_PER_SECOND". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

#define SITE(n) __attribute__((noinline)) static void site##n(void* live[], unsigned i) { \
    free(live[i % 64]); live[i % 64] = malloc(16 + n * 8); }
SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7)
SITE(8) SITE(9) SITE(10) SITE(11) SITE(12) SITE(13) SITE(14) SITE(15)
static void (*sites[16])(void**, unsigned) = {site0, site1, site2, site3, site4, site5, site6,
    site7, site8, site9, site10, site11, site12, site13, site14, site15};

int main(void) {
  char line[128];
  static void* live[64];
  printf("ready %d\n", getpid());
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    double rate, seconds;
    if (sscanf(line, "pace %lf %lf", &rate, &seconds) == 2) {
      uint64_t t0 = now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
      double calls = 0;
      unsigned i = 0;
      for (uint64_t t = t0; t < end; t = now_ns()) {
        double due = rate * (double)(t - t0) / 1e9;
        while (calls < due) {
          for (int k = 0; k < 50; k++, i++) sites[i % 16](live, i * 7);
          calls += 100;
        }
      }
      printf("achieved %.0f\n", calls / ((double)(now_ns() - t0) / 1e9));
    } else if (!strncmp(line, "exit", 4)) {
      break;
    }
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
