/* A program with its allocator linked in (jemalloc's static library), as Redis or ClickHouse
 * are built: its own malloc calls are direct calls into the executable, reaching no GOT slot.
 * Commands: "leak" does 10 x malloc(100) and mallocx(200) from here (direct), and strdup of
 * 299 characters, which libc makes through its own slot (bound to this executable's malloc). */
#include <jemalloc/jemalloc.h>
#include "harness.h"

static void* kept[1024];
static int nkept;
static char* (*volatile duplicate)(const char*) = strdup; /* a call the compiler cannot fold */

NOINLINE static void leak(void) {
  static char text[300];
  memset(text, 'x', 299);
  for (int i = 0; i < 10; i++) kept[nkept++ % 1024] = memset(malloc(100), 1, 100);
  kept[nkept++ % 1024] = mallocx(200, 0);
  kept[nkept++ % 1024] = duplicate(text);
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "leak")) leak();
    harness_done();
  }
  return 0;
}
