// memhook's clocks: CLOCK_MONOTONIC, and the clock the target's records carry (segment.h).
#pragma once
#include <stdint.h>
#include <time.h>
#include "arch.h"
#include "segment.h"

namespace memhook {

inline uint64_t monotonic_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + ts.tv_nsec;
}

inline uint64_t read_clock(uint32_t clock) {
  return clock == kClockTsc ? arch::cycles_ordered() : monotonic_ns();
}

}  // namespace memhook
