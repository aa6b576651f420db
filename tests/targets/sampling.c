/* A known workload for sampling mode: four call sites, each allocating COUNT[i] blocks of
 * SIZE[i] bytes and freeing every other one, in one interleaved stream (so every site sees the
 * same sampling process). "go" runs it, "release" frees what it kept. */
#include "harness.h"

static const size_t SIZE[4] = {48, 1000, 20000, 300000};
static const int COUNT[4] = {120000, 40000, 4000, 400};

NOINLINE static void* site_small(void) { return malloc(SIZE[0]); }
NOINLINE static void* site_medium(void) { return malloc(SIZE[1]); }
NOINLINE static void* site_large(void) { return malloc(SIZE[2]); }
NOINLINE static void* site_huge(void) { return malloc(SIZE[3]); }

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
    } else if (!strcmp(cmd, "release")) {
      while (kept) free(keep[--kept]);
    }
    harness_done();
  }
  for (int i = 0; i < kept; i++) free(keep[i]);
  return 0;
}
