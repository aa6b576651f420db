/* libleakcheck.so, tests/targets/leak_check.c's library: its leak is known by its module. */
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) void lib_leak(void) {
  for (int i = 0; i < 4; i++) memset(malloc(250), 3, 250);
}
