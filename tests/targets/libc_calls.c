/* Every allocating call of the C library, each from its own function, for libcs other than the
 * host's glibc (musl: built with musl-gcc). Everything allocated is kept unless freed on
 * purpose, so the report's bytes are known. Commands:
 *   each      malloc 1001, calloc 3 x 333, realloc of a malloc(10) to 2002, posix_memalign
 *             (64) 3003, strdup of 4003 characters (4004 bytes), and 100 malloc(555)/free pairs
 *   dlopen PATH   load a library; plugin N: call its plugin_leak(N)
 * Built with -DNO_DL it calls no dlopen (a glibc before 2.34 then loads no libdl). */
#ifndef NO_DL
#include <dlfcn.h>
#endif
#include "harness.h"

static void* kept[64];
static int nkept;
#ifndef NO_DL
static void* plugin;
#endif

NOINLINE static void leak_malloc(void) { kept[nkept++] = malloc(1001); }
NOINLINE static void leak_calloc(void) { kept[nkept++] = calloc(3, 333); }
NOINLINE static void leak_realloc(void) {
  char* p = malloc(10);
  memset(p, 1, 10);
  kept[nkept++] = realloc(p, 2002);
}
NOINLINE static void leak_memalign(void) {
  void* p = NULL;
  if (posix_memalign(&p, 64, 3003) == 0) kept[nkept++] = p;
}
NOINLINE static void leak_strdup(void) {
  static char text[4004];
  memset(text, 'x', 4003);
  kept[nkept++] = strdup(text);
}
NOINLINE static void churn(void) {
  for (int i = 0; i < 100; i++) {
    char* p = malloc(555);
    memset(p, 1, 555);
    free(p);
  }
}

int main(void) {
  char cmd[256];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "each")) {
      leak_malloc();
      leak_calloc();
      leak_realloc();
      leak_memalign();
      leak_strdup();
      churn();
    }
#ifndef NO_DL
    else if (!strncmp(cmd, "dlopen ", 7)) {
      plugin = dlopen(cmd + 7, RTLD_NOW);
      if (!plugin) printf("dlopen failed: %s\n", dlerror());
    } else if (!strncmp(cmd, "plugin ", 7)) {
      void (*leak)(int) = (void (*)(int))dlsym(plugin, "plugin_leak");
      leak(atoi(cmd + 7));
    }
#endif
    harness_done();
  }
  return 0;
}
