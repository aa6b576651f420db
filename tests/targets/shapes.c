/* Three shapes of outstanding memory over 3 seconds ("run"): a steady leak (100 B every 10 ms),
 * a bounded cache (1 KiB every 10 ms for the first 0.8 s, then full) and start-up data (200 KB
 * once, at the start). By bytes the steady leak is the smallest; by growth it is the leak. */
#include <sys/mman.h>
#include "harness.h"

static void* cache[80];

NOINLINE static void* startup_data(void) { void* p = malloc(200000); memset(p, 1, 200000); return p; }
NOINLINE static void steady_leak(void) { memset(malloc(100), 1, 100); }
NOINLINE static void cache_fill(int i) { if (i < 80) { cache[i] = malloc(1024); memset(cache[i], 1, 1024); } }
NOINLINE static void churn(void) { for (int i = 0; i < 20; i++) free(malloc(64)); }

int main(void) {
  char cmd[64];
  void* keep = 0;
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "run")) {
      keep = startup_data();
      for (int i = 0; i < 300; i++) {
        steady_leak();
        cache_fill(i);
        churn();
        usleep(10000);
      }
    }
    if (!strcmp(cmd, "mmap")) {  /* 8 MiB of anonymous memory over 2 s, none of it malloc'd */
      for (int i = 0; i < 20; i++) {
        char* p = mmap(0, 409600, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        memset(p, 1, 409600);
        usleep(100000);
      }
    }
    harness_done();
  }
  free(keep);
  return 0;
}
