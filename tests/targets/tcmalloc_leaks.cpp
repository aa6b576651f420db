/* A program with tcmalloc (gperftools' libtcmalloc_minimal.a) linked in, as MongoDB and Envoy
 * carry theirs: malloc and operator new are tcmalloc's, in the executable, beside its tc_* API
 * (the same functions under a second name). Commands:
 *   leak    malloc(1000), tc_malloc(2000), tc_calloc(3, 100), tc_realloc of a tc_malloc(10) to
 *           3000, tc_memalign(64, 4000), new char[5000], tc_new(6000), each from its own function
 *   stats   the allocator's own statistics, as memhook reads them
 *   churn   100 tc_malloc(555)/tc_free, 100 tc_new(777)/tc_delete_sized, 100 new int/delete,
 *           100 tc_malloc(333)/tc_free_sized */
#include <gperftools/malloc_extension_c.h>
#include <gperftools/tcmalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"

static void* kept[64];
static int nkept;
static void keep(void* p) { kept[nkept++ % 64] = p; }

extern "C" {
NOINLINE void leak_malloc() { keep(malloc(1000)); }
NOINLINE void leak_tc_malloc() { keep(tc_malloc(2000)); }
NOINLINE void leak_tc_calloc() { keep(tc_calloc(3, 100)); }
NOINLINE void leak_tc_realloc() { keep(tc_realloc(tc_malloc(10), 3000)); }
NOINLINE void leak_tc_memalign() { keep(tc_memalign(64, 4000)); }
NOINLINE void leak_new() { keep(new char[5000]); }
NOINLINE void leak_tc_new() { keep(tc_new(6000)); }
NOINLINE void churn() {
  for (int i = 0; i < 100; i++) tc_free(memset(tc_malloc(555), 1, 555));
  for (int i = 0; i < 100; i++) tc_delete_sized(memset(tc_new(777), 1, 777), 777);
  for (int i = 0; i < 100; i++) delete new volatile int(i);
  for (int i = 0; i < 100; i++) tc_free_sized(memset(tc_malloc(333), 1, 333), 333);
}
}

int main() {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "leak")) {
      leak_malloc();
      leak_tc_malloc();
      leak_tc_calloc();
      leak_tc_realloc();
      leak_tc_memalign();
      leak_new();
      leak_tc_new();
    } else if (!strcmp(cmd, "churn")) {
      churn();
    } else if (!strcmp(cmd, "stats")) { /* tcmalloc's own account, as memhook reads it */
      size_t allocated = 0, heap = 0;
      MallocExtension_GetNumericProperty("generic.current_allocated_bytes", &allocated);
      MallocExtension_GetNumericProperty("generic.heap_size", &heap);
      printf("stats allocated %zu heap_size %zu\n", allocated, heap);
    }
    harness_done();
  }
  return 0;
}
