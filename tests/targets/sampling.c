/* A known workload for sampling mode: four call sites, each allocating COUNT[i] blocks of
 * SIZE[i] bytes and freeing every other one, in one interleaved stream (so every site sees the
 * same sampling process). "go" runs it, "grow" reallocs 8,000 small blocks to 20,000 bytes,
 * "release" frees what they kept. */
#include "harness.h"

static const size_t SIZE[4] = {48, 1000, 20000, 300000};
static const int COUNT[4] = {120000, 40000, 4000, 400};

NOINLINE static void* site_small(void) { return malloc(SIZE[0]); }
NOINLINE static void* site_medium(void) { return malloc(SIZE[1]); }
NOINLINE static void* site_large(void) { return malloc(SIZE[2]); }
NOINLINE static void* site_huge(void) { return malloc(SIZE[3]); }
NOINLINE static void* grow_source(void) { return malloc(48); }
NOINLINE static void* grow_site(void* p) { return realloc(p, 20000); }

int main(void) {
  void* (*site[4])(void) = {site_small, site_medium, site_large, site_huge};
  static void* keep[200000];
  int kept = 0;
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "go")) {
      int done[4] = {0, 0, 0, 0};
      for (int round = 0;; round++) {
        int any = 0;
        for (int s = 0; s < 4; s++) {
          /* Interleave in proportion to the counts: about 300 small per huge. */
          int batch = COUNT[s] / 400;
          for (int b = 0; b < batch && done[s] < COUNT[s]; b++, done[s]++, any = 1) {
            char* p = site[s]();
            p[0] = 1;
            if (done[s] % 2) free(p);
            else keep[kept++] = p;
          }
        }
        if (!any) break;
      }
    } else if (!strcmp(cmd, "grow")) {
      /* 8,000 blocks of 48 bytes, each grown to 20,000 by realloc; every other one freed. */
      for (int i = 0; i < 8000; i++) {
        char* p = grow_site(grow_source());
        p[0] = 1;
        if (i % 2) free(p);
        else keep[kept++] = p;
      }
    } else if (!strcmp(cmd, "release")) {
      while (kept) free(keep[--kept]);
    }
    harness_done();
  }
  for (int i = 0; i < kept; i++) free(keep[i]);
  return 0;
}
