/* The session's peak (issue 34): "peak" holds 100 MiB in 100 blocks of 1 MiB from hold_big,
 * frees them all, then leaks 1 MiB in 16 blocks of 64 KiB from leak_small. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void* big[100];
static void* small[16];

NOINLINE static void hold_big(void) {
  for (int i = 0; i < 100; i++) big[i] = memset(malloc(1 << 20), 1, 4096);
}
NOINLINE static void leak_small(void) {
  for (int i = 0; i < 16; i++) small[i] = memset(malloc(64 << 10), 2, 64 << 10);
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "peak")) {
      hold_big();
      for (int i = 0; i < 100; i++) free(big[i]);
      leak_small();
    }
    harness_done();
  }
  return 0;
}
