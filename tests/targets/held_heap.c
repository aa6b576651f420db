/* A heap of a chosen size for the leak check (benchmarks/leak_check.py, and a test that kills
 * memhook during the check): "fill MIB SIZE" allocates MIB MiB in
 * blocks of SIZE bytes, every page written, each block's address kept in a table a global
 * holds (reachable), but one in 16 dropped (definitely lost); prints "blocks N". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void** table;

static void fill(size_t mib, size_t size) {
  const size_t n = (mib << 20) / size;
  table = malloc(n * sizeof *table);
  for (size_t i = 0; i < n; i++) {
    char* p = malloc(size);
    memset(p, (int)(i & 0x7f), size);
    table[i] = (i % 16 == 15) ? NULL : p;
  }
  printf("blocks %zu\n", n);
}

int main(void) {
  char line[128];
  printf("ready\n");
  fflush(stdout);
  while (fgets(line, sizeof line, stdin) && strcmp(line, "exit\n") != 0) {
    size_t mib, size;
    if (sscanf(line, "fill %zu %zu", &mib, &size) == 2) fill(mib, size);
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
