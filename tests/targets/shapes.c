/* Four shapes of outstanding memory over 3 seconds ("run"): a steady leak (100 B every 10 ms),
 * a bounded cache (1 KiB every 10 ms for the first 0.8 s, then full), start-up data (200 KB
 * once, at the start) and per-request memory (4 KiB every 10 ms, all freed every tenth step,
 * as a server frees a request's working memory; "run" ends in the middle of a request). By
 * bytes the steady leak is the smallest; by growth it is the leak; the requests are churn. */
#include <sys/mman.h>
#include "harness.h"

static void* cache[80];

NOINLINE static void* startup_data(void) { void* p = malloc(200000); memset(p, 1, 200000); return p; }
NOINLINE static void steady_leak(void) { memset(malloc(100), 1, 100); }
NOINLINE static void cache_fill(int i) { if (i < 80) { cache[i] = malloc(1024); memset(cache[i], 1, 1024); } }
static void* request[10];
NOINLINE static void request_memory(int i) {
  request[i % 10] = malloc(4096);
  memset(request[i % 10], 1, 4096);
  if (i % 10 == 9)
    for (int j = 0; j < 10; j++) free(request[j]);
}
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
        request_memory(i + 5);
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
