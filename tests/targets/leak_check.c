/* Three leaks for the CI leak check (issue 34): "leak" makes all three, each from its own
 * function: leak_known 5 x malloc(100) (a suppression names the function), lib_leak in
 * libleakcheck.so 4 x malloc(250) (one names the module), leak_new 3 x malloc(100) (none).
 * Each block's address is dropped (definitely lost, issue 44); "hold" keeps 7 x 64 bytes in a
 * global (reachable: not a leak for --fail-on-leak, outstanding all the same). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

void lib_leak(void);
static void* kept[16];
static int n;

NOINLINE static void leak_known(void) {
  for (int i = 0; i < 5; i++) memset(malloc(100), 1, 100);
}
NOINLINE static void leak_new(void) {
  for (int i = 0; i < 3; i++) memset(malloc(100), 2, 100);
}
NOINLINE static void hold(void) {
  for (int i = 0; i < 7; i++) kept[n++] = memset(malloc(64), 4, 64);
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "leak")) {
      leak_known();
      lib_leak();
      leak_new();
    }
    if (!strcmp(cmd, "hold")) hold();
    harness_done();
  }
  return 0;
}
