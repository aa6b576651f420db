// memhook's clocks: CLOCK_MONOTONIC, and the clock the target's records carry (segment.h).
#pragma once
#include <stdint.h>
#include <time.h>
#include <x86intrin.h>

#include "segment.h"

namespace memhook {

inline uint64_t monotonic_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + ts.tv_nsec;
}

inline uint64_t read_clock(uint32_t clock) {
  if (clock != kClockTsc) return monotonic_ns();
  unsigned aux;
  _mm_lfence();
  uint64_t t = __rdtscp(&aux);
  _mm_lfence();
  return t;
}

}  // namespace memhook
