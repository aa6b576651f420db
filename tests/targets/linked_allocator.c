/* A program with its allocator linked in (jemalloc's static library), as Redis or ClickHouse
 * are built: its own calls to malloc and the rest are direct calls into the executable, through
 * no GOT slot (memhook patches their entries). Commands:
 *   leak    10 x malloc(100), calloc(3, 333), realloc of a malloc(10) to 2002, posix_memalign
 *           (64) 3003, each from its own function; strdup of 299 characters through a function
 *           pointer (libc's strdup calls this executable's malloc through libc's own slot);
 *           jemalloc's own API: mallocx(200); rallocx of a mallocx(20) to 4004; xallocx of a
 *           mallocx(1000) to 600 with 300 extra (in place: its size class holds 900)
 *   stats   the allocator's own statistics, as memhook reads them
 *   churn   100 malloc(555)/free pairs; 100 mallocx(555)/sdallocx and 100 mallocx(777)/dallocx
 * With the argument "threads", 8 threads call malloc and free in pairs all along, pausing 50 us
 * every 20 pairs. */
#include <pthread.h>
#include <time.h>
#include <jemalloc/jemalloc.h>
#include "harness.h"

static void* kept[1024];
static int nkept;
static char* (*volatile duplicate)(const char*) = strdup; /* a call the compiler cannot fold */

static void keep(void* p) { kept[nkept++ % 1024] = p; }
NOINLINE static void leak_malloc(void) { for (int i = 0; i < 10; i++) keep(memset(malloc(100), 1, 100)); }
NOINLINE static void leak_calloc(void) { keep(calloc(3, 333)); }
NOINLINE static void leak_realloc(void) { keep(realloc(memset(malloc(10), 1, 10), 2002)); }
NOINLINE static void leak_memalign(void) {
  void* p = NULL;
  if (posix_memalign(&p, 64, 3003) == 0) keep(p);
}
NOINLINE static void leak_strdup(void) {
  static char text[300];
  memset(text, 'x', 299);
  keep(duplicate(text));
}
NOINLINE static void leak_mallocx(void) { keep(mallocx(200, 0)); }
NOINLINE static void leak_rallocx(void) { keep(rallocx(memset(mallocx(20, 0), 1, 20), 4004, 0)); }
NOINLINE static void leak_xallocx(void) {
  void* p = mallocx(1000, 0);
  if (xallocx(p, 600, 300, 0) >= 900) keep(p);
}
NOINLINE static void churn(void) {
  for (int i = 0; i < 100; i++) free(memset(malloc(555), 1, 555));
}
NOINLINE static void churn_api(void) {
  for (int i = 0; i < 100; i++) sdallocx(memset(mallocx(555, 0), 1, 555), 555, 0);
  for (int i = 0; i < 100; i++) dallocx(memset(mallocx(777, 0), 1, 777), 0);
}

static void* pairs(void* arg) {
  (void)arg;
  struct timespec pause = {0, 50000};
  for (unsigned i = 0;; i++) {
    free(memset(malloc(64 + i % 64), 1, 8));
    if (i % 20 == 19) nanosleep(&pause, NULL);
  }
  return NULL;
}

int main(int argc, char** argv) {
  char cmd[64];
  pthread_t t;
  for (int i = 0; argc > 1 && !strcmp(argv[1], "threads") && i < 8; i++)
    pthread_create(&t, NULL, pairs, NULL);
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "leak")) {
      leak_malloc();
      leak_calloc();
      leak_realloc();
      leak_memalign();
      leak_strdup();
      leak_mallocx();
      leak_rallocx();
      leak_xallocx();
    } else if (!strcmp(cmd, "churn")) {
      churn();
      churn_api();
    } else if (!strcmp(cmd, "stats")) { /* jemalloc's own account, as memhook reads it */
      uint64_t epoch = 1;
      size_t len = sizeof epoch, allocated = 0, active = 0;
      mallctl("epoch", &epoch, &len, &epoch, len);
      len = sizeof allocated;
      mallctl("stats.allocated", &allocated, &len, NULL, 0);
      mallctl("stats.active", &active, &len, NULL, 0);
      printf("stats allocated %zu active %zu\n", allocated, active);
    }
    harness_done();
  }
  return 0;
}
