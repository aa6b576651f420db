/* Snapshots (issue 34): "grow N" keeps N blocks of 1000 bytes, from grow; "balloon MIB" keeps
 * 1 MiB blocks from balloon, each written through (resident), one every 20 ms, until it has MIB
 * of them or the OOM killer ends it. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

NOINLINE static void grow(int n) {
  for (int i = 0; i < n; i++) memset(malloc(1000), 1, 1000);
}

NOINLINE static void balloon(int mib) {
  struct timespec pace = {0, 20000000};
  for (int i = 0; i < mib; i++) {
    memset(malloc(1 << 20), 2, 1 << 20);
    nanosleep(&pace, NULL);
  }
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strncmp(cmd, "grow ", 5)) grow(atoi(cmd + 5));
    if (!strncmp(cmd, "balloon ", 8)) balloon(atoi(cmd + 8));
    harness_done();
  }
  return 0;
}
