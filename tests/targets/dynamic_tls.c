/* dlopen's argv[1] (dynamic_tls_lib.c) at start; "hold" makes the main thread keep a block of
 * 1014 bytes only in that library's __thread variable (dynamic TLS): reachable, as valgrind and
 * LeakSanitizer say. */
#include <dlfcn.h>
#include "harness.h"

int main(int argc, char** argv) {
  void* lib = argc > 1 ? dlopen(argv[1], RTLD_NOW) : NULL;
  void (*hold)(void) = lib ? (void (*)(void))dlsym(lib, "hold_in_tls") : NULL;
  if (!hold) return 2;
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "hold")) hold();
    harness_done();
  }
  return 0;
}
