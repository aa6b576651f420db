// Which calls are recorded when not every call is: the size filter, and sampling (a Poisson
// process over allocated bytes per thread, with the filter of live sampled blocks for frees).
#pragma once

namespace {

inline bool size_wanted(uint64_t size) { return size >= g_min_size && size <= g_max_size; }

// Sampling: a Poisson process over allocated bytes, per thread.

// ln(x) for x in (0, 1], to ~1e-10: the hook library does not pull in libm.
double log_unit(double x) {
  uint64_t bits;  // x = m * 2^e, m in [0.5, 1); x is normal here
  memcpy(&bits, &x, 8);
  int e = int((bits >> 52) & 0x7ff) - 1022;
  bits = (bits & ~(uint64_t(0x7ff) << 52)) | (uint64_t(1022) << 52);
  double m;
  memcpy(&m, &bits, 8);
  if (m < 0.70710678118654752) {
    m *= 2;
    e--;
  }
  double s = (m - 1) / (m + 1), s2 = s * s;
  double series = s * (2 + s2 * (2.0 / 3 + s2 * (2.0 / 5 + s2 * (2.0 / 7 + s2 * (2.0 / 9 +
                  s2 * (2.0 / 11 + s2 * (2.0 / 13)))))));
  return series + e * 0.69314718055994531;
}

// Bytes until the next sample: exponential with mean g_sample_rate.
__attribute__((noinline)) int64_t next_sample_interval(ThreadState& t) {
  if (t.sample_generation != g_session.generation) {
    t.sample_generation = g_session.generation;
    t.rng = (uint64_t)syscall(SYS_gettid) * 0x9E3779B97F4A7C15ull ^ arch::cycles();
  }
  uint64_t x = t.rng ? t.rng : 0x2545F4914F6CDD1Dull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  t.rng = x;
  double u = double((x * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;  // [0, 1)
  return (int64_t)(-log_unit(1.0 - u) * double(g_sample_rate)) + 1;
}

// Is this call of `size` bytes recorded, its countdown having reached zero (sampling: with
// probability 1 - exp(-size/rate); the countdown is exponential, so memoryless), then a fresh
// interval. A countdown left from an earlier session is kept: drawn with that session's rate,
// and exact when the rate is unchanged.
__attribute__((noinline)) bool chosen_slow(ThreadState& t, uint64_t size) {
  if (!g_sample_rate) return !g_size_filter || size_wanted(size);
  if (t.sample_generation != g_session.generation) {  // this thread's first look in this session
    t.sample_left = next_sample_interval(t) - (int64_t)size;
    if (t.sample_left > 0) return false;
  }
  t.sample_left = next_sample_interval(t);
  return !g_size_filter || size_wanted(size);
}

// Sampling's common case: subtract `size` from the countdown; true while bytes remain. One
// read-modify-write instruction whose flags answer (a signed "greater": the same as the
// subtraction's result > 0 for any countdown and size below 2^62).
inline bool count_down(ThreadState& t, uint64_t size) { return arch::count_down(t.sample_left, size); }

// The same decision for reallocs, countdown included.
inline bool chosen(ThreadState& t, uint64_t size) {
  if (g_sample_rate && __builtin_expect(count_down(t, size), 1)) return false;
  return chosen_slow(t, size);
}

// Sampling mode: a counting filter of the sampled blocks still live, so that the free of a block
// that was not sampled (nearly every free) reads one byte of a 4 KiB array the core keeps close,
// not the pointer's entry in the 32 MiB address table (an entry far from anything else the free
// touches: malloc/free loops ran 1.2-1.5x slower for that one load: docs/benchmarks.md,
// "Allocation latency"). A counter is raised when a
// block is sampled and lowered when its free is recorded; zero: no sampled block lives there.
// Lost table entries only leave counters raised (the table is still asked); 255 sticks.
alignas(64) uint8_t g_sampled[4096];

inline uint8_t* sampled_counter(uint64_t p) { return &g_sampled[((p ^ p >> 12) >> 4) & 4095]; }

// delta +1: `p` was sampled; -1: its free is recorded. Rare (once per sample): a CAS loop.
__attribute__((noinline)) void count_sampled(uint64_t p, int delta) {
  uint8_t* c = sampled_counter(p);
  uint8_t v = __atomic_load_n(c, __ATOMIC_RELAXED);
  while (v != 255 && (delta > 0 || v != 0) &&
         !__atomic_compare_exchange_n(c, &v, uint8_t(v + delta), true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
}

// Sampling mode: is `p` a sampled block still live? The filter says no for nearly every block;
// the address table answers for the rest.
inline bool sampled_live(uint64_t p) {
  if (!__atomic_load_n(sampled_counter(p), __ATOMIC_RELAXED)) return false;
  TableIndex ti = table_index(p);
  uint64_t e = __atomic_load_n(g_table + ti.index, __ATOMIC_RELAXED);
  return (e & kTagMask) == (ti.tag & kTagMask) && (e & kLive);
}

}  // namespace
