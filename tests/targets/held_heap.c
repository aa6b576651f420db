/* A heap of a chosen size for the leak check (benchmarks/leak_check.py, and a test that kills
 * memhook during the check): "fill MIB SIZE" allocates MIB MiB in
 * blocks of SIZE bytes, every page written, each block's address kept in a table a global
 * holds (reachable), but one in 16 dropped (definitely lost); prints "blocks N". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* volatile: only ever written, a static may be dropped by the compiler (gcc -O2 for AArch64 does:
 * its table was then lost, as valgrind said too). */
static void** volatile table;

/* The stack below main's frame zeroed after a fill: the last block's pointer, left in a slot the
 * next fgets() frame does not write, would be a root (as harness.h's harness_scrub). */
__attribute__((noinline)) static void scrub(void) {
  volatile char junk[16384];
  memset((char*)junk, 0, sizeof junk);
}

__attribute__((noinline)) static void fill(size_t mib, size_t size) {  /* (its registers not main's) */
  const size_t n = (mib << 20) / size;
  void** const t = malloc(n * sizeof *t);
  table = t;
  for (size_t i = 0; i < n; i++) {
    char* p = malloc(size);
    memset(p, (int)(i & 0x7f), size);
    t[i] = (i % 16 == 0) ? NULL : p;  /* (not the last: its pointer may linger in a register) */
  }
  printf("blocks %zu\n", n);
}

int main(void) {
  char line[128];
  printf("ready\n");
  fflush(stdout);
  while (fgets(line, sizeof line, stdin) && strcmp(line, "exit\n") != 0) {
    size_t mib, size;
    if (sscanf(line, "fill %zu %zu", &mib, &size) == 2) {
      fill(mib, size);
      scrub();
    }
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
