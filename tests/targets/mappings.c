/* The program's own anonymous mappings (issue 33's mmap hooks): each command maps, cuts, moves
 * or releases them in a known way, so that a report can be checked to the byte.
 *   map      64 MiB mapped by map_cache, its first 32 MiB touched
 *   trim     its last 16 MiB unmapped
 *   release  its first 8 MiB given back (madvise MADV_DONTNEED)
 *   hole     4 MiB unmapped in its middle (from 16 MiB on)
 *   grow     a 4 MiB mapping (map_small) grown to 12 MiB by grow_small (mremap MAYMOVE), touched
 *   file     a file mapped (not anonymous: not counted)
 *   old      unmaps 2 MiB mapped before attach (at start-up)
 * Mapped before attach: 2 MiB (early_map). */
#define _GNU_SOURCE 1
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"

static char *region, *small, *early, *file_map;

NOINLINE static char* map_cache(size_t n) {
  return (char*)mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}
NOINLINE static char* map_small(size_t n) { return map_cache(n); }
NOINLINE static char* grow_small(char* p, size_t old, size_t n) {
  return (char*)mremap(p, old, n, MREMAP_MAYMOVE);
}
NOINLINE static char* early_map(size_t n) {
  return (char*)mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

int main(int argc, char** argv) {
  early = early_map(2 << 20);
  memset(early, 1, 2 << 20);
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "map")) {
      region = map_cache(64 << 20);
      memset(region, 1, 32 << 20);
    } else if (!strcmp(cmd, "trim")) {
      munmap(region + (48 << 20), 16 << 20);
    } else if (!strcmp(cmd, "release")) {
      madvise(region, 8 << 20, MADV_DONTNEED);
    } else if (!strcmp(cmd, "hole")) {
      munmap(region + (16 << 20), 4 << 20);
    } else if (!strcmp(cmd, "grow")) {
      small = map_small(4 << 20);
      memset(small, 2, 4 << 20);
      small = grow_small(small, 4 << 20, 12 << 20);
      memset(small, 3, 12 << 20);
    } else if (!strcmp(cmd, "file")) {
      int fd = open(argv[0], O_RDONLY);
      file_map = (char*)mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
      close(fd);
    } else if (!strcmp(cmd, "old")) {
      munmap(early, 2 << 20);
    } else if (!strcmp(cmd, "where")) {
      printf("region %p\n", (void*)region);
    }
    harness_done();
  }
  return 0;
}
