/* A thread that wakes every millisecond and records the longest gap between two wake-ups:
 * while memhook (GDB) holds the process stopped, or anything else stalls it, the gap grows by
 * that much. max_gap_us is read and reset by the target's commands. */
#ifndef MEMHOOK_STALL_DETECTOR_H
#define MEMHOOK_STALL_DETECTOR_H
#include <stdint.h>
#include <time.h>

static volatile int64_t max_gap_us;

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void* detector(void* arg) {
  (void)arg;
  int64_t last = now_us();
  struct timespec ms = {0, 1000000};
  for (;;) {
    nanosleep(&ms, 0);
    int64_t t = now_us();
    if (t - last > max_gap_us) max_gap_us = t - last;
    last = t;
  }
  return 0;
}
#endif
