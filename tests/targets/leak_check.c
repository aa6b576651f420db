/* Three leaks for the CI leak check (issue 34): "leak" makes all three, each from its own
 * function: leak_known 5 x malloc(100) (a suppression names the function), lib_leak in
 * libleakcheck.so 4 x malloc(250) (one names the module), leak_new 3 x malloc(100) (none). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

void lib_leak(void);
static void* kept[16];
static int n;

NOINLINE static void leak_known(void) {
  for (int i = 0; i < 5; i++) kept[n++] = memset(malloc(100), 1, 100);
}
NOINLINE static void leak_new(void) {
  for (int i = 0; i < 3; i++) kept[n++] = memset(malloc(100), 2, 100);
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
    harness_done();
  }
  return 0;
}
