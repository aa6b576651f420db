/* Blocks freed after known delays, each lifetime measured by the target itself: from malloc's
 * return to the call of free. "busy": the thread keeps allocating at a steady pace while it
 * waits and between blocks (a busy thread: 12 us, 96 us, 384 us, 12 ms, 96 ms, five blocks
 * each); "sleep": it sleeps instead (a quiet thread). Each block's lifetime is printed as "life NS" (a bucket's middle: 1.5 x
 * a power of two, far from its edges). */
#include <time.h>
#include "harness.h"

static const long kDelays[] = {12000, 96000, 384000, 12000000, 96000000};

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

NOINLINE static char* timed_block(void) {
  char* p = malloc(100);
  __asm__ volatile("" ::: "memory");  /* a call, not a tail call: timed_block is the call site */
  return p;
}
NOINLINE static void churn_while_waiting(void) {
  char* q = malloc(24);
  __asm__ volatile("" : : "r"(q) : "memory");  /* the compiler may not elide the pair */
  free(q);
  for (volatile int i = 0; i < 400; i++) {}  /* a steady pace the consumer keeps up with, loaded or not */
}

static void run(int busy) {
  /* A busy thread has a history: memhook learns its pace from its first windows. */
  for (long t = now_ns(); now_ns() - t < 20000000;) churn_while_waiting();
  for (int d = 0; d < 5; d++)
    for (int k = 0; k < 5; k++) {
      char* p = timed_block();
      long t0 = now_ns(), t1;
      p[0] = 1;
      if (busy) {
        while ((t1 = now_ns()) - t0 < kDelays[d]) churn_while_waiting();
      } else {
        struct timespec ts = {kDelays[d] / 1000000000L, kDelays[d] % 1000000000L};
        nanosleep(&ts, 0);
        t1 = now_ns();
      }
      free(p);
      printf("life %ld\n", t1 - t0);
      for (long t = now_ns(); now_ns() - t < 20000;) churn_while_waiting();  /* the same pace */
    }
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "busy")) run(1);
    if (!strcmp(cmd, "sleep")) run(0);
    harness_done();
  }
  return 0;
}
