/* A program's own wrapper of malloc (as Redis's zmalloc or git's xmalloc) called from six places
 * at one depth: the wrapper's return address and stack pointer are the same for all six, so the
 * stacks share one recent stack's key (hook_library/recent_stacks.h). "go N": N rounds, each
 * allocation kept; caller k allocates 100 + k bytes, in an order that changes every round (each
 * caller after each other), more callers than a set of recent stacks holds. */
#include <stdlib.h>
#include "harness.h"

NOINLINE void* xmalloc(size_t n) {
  void* p = malloc(n);
  if (!p) abort();
  __asm__ volatile("" ::: "memory");
  return p;
}

#define CALLER(k) \
  NOINLINE void* caller##k(void) { void* p = xmalloc(100 + k); __asm__ volatile("" ::: "memory"); return p; }
CALLER(0) CALLER(1) CALLER(2) CALLER(3) CALLER(4) CALLER(5)
static void* (*const callers[6])(void) = {caller0, caller1, caller2, caller3, caller4, caller5};

NOINLINE static void run(int rounds) {
  for (int r = 0; r < rounds; r++)
    for (int i = 0; i < 6; i++) {
      void* volatile p = callers[(i * (r % 2 ? 5 : 1) + r) % 6]();  /* each once a round */
      (void)p;  /* kept: a leak of caller k's 100 + k bytes */
    }
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strncmp(cmd, "go ", 3)) run(atoi(cmd + 3));
    harness_done();
  }
  return 0;
}
