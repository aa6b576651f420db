/* A program using the shared libmimalloc through its mi_* API (calls through GOT slots), with
 * mimalloc's malloc in place of glibc's (libmimalloc.so defines malloc, and comes first).
 * Commands:
 *   leak    mi_malloc(1000), mi_calloc(3, 100), mi_realloc of a mi_malloc(10) to 3000,
 *           mi_zalloc(500), mi_malloc_aligned(4000, 64), malloc(700), each from its own function
 *   stats   the allocator's own statistics, as memhook reads them
 *   churn   100 mi_malloc(555)/mi_free, 100 mi_malloc(777)/mi_free_size
 *   strdup  mi_strdup of 99 characters: memhook has no hook for it (and says so) */
#include <mimalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"

static void* kept[64];
static int nkept;
static void keep(void* p) { kept[nkept++ % 64] = p; }

NOINLINE static void leak_mi_malloc(void) { keep(mi_malloc(1000)); }
NOINLINE static void leak_mi_calloc(void) { keep(mi_calloc(3, 100)); }
NOINLINE static void leak_mi_realloc(void) { keep(mi_realloc(mi_malloc(10), 3000)); }
NOINLINE static void leak_mi_zalloc(void) { keep(mi_zalloc(500)); }
NOINLINE static void leak_mi_aligned(void) { keep(mi_malloc_aligned(4000, 64)); }
NOINLINE static void leak_malloc(void) { keep(malloc(700)); }
NOINLINE static void churn(void) {
  for (int i = 0; i < 100; i++) mi_free(memset(mi_malloc(555), 1, 555));
  for (int i = 0; i < 100; i++) mi_free_size(memset(mi_malloc(777), 1, 777), 777);
}

int main(void) {
  char cmd[64];
  static char text[100];
  memset(text, 'x', 99);
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "leak")) {
      leak_mi_malloc();
      leak_mi_calloc();
      leak_mi_realloc();
      leak_mi_zalloc();
      leak_mi_aligned();
      leak_malloc();
    } else if (!strcmp(cmd, "churn")) {
      churn();
    } else if (!strcmp(cmd, "strdup")) {
      keep(mi_strdup(text));
    } else if (!strcmp(cmd, "stats")) { /* mimalloc's own account, as memhook reads it */
      size_t elapsed, user, sys, rss, peak_rss, commit, peak_commit, faults;
      mi_process_info(&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
      printf("stats peak_commit %zu\n", peak_commit);
    }
    harness_done();
  }
  return 0;
}
