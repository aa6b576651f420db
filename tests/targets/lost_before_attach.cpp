/* Blocks lost before memhook attached, and pointers held only by blocks from before attach
 * (issue 44). Sizes are ones whose malloc_usable_size is the size asked (glibc: n + 8 a
 * multiple of 16), so the census's bytes are valgrind's. At start, before "ready":
 *   five Widget (40 B, a vtable: the census names the type) lost;
 *   three 200-byte buffers lost;
 *   g_holder (64 B) held by a global, g_doomed (72 B) held by a global until "more".
 * "more", once traced:
 *   held_by_old: a 1016 B block whose only pointer is in g_holder's block: reachable;
 *   lost_through_old: a 1032 B block whose only pointer is in g_doomed's block, which is then
 *     lost: the 72 B block definitely lost (before attach), the 1032 B indirectly;
 *   lost_after: two 1048 B blocks lost: definitely lost, with their stack. */
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "harness.h"

struct Widget {
  virtual ~Widget() = default;
  long a = 1, b = 2, c = 3, d = 4;
};

static void* volatile g_sink;
static void** volatile g_holder;
static void** volatile g_doomed;

NOINLINE static void lose_widgets() {
  for (int i = 0; i < 5; i++) g_sink = new Widget;
  g_sink = nullptr;
}
NOINLINE static void lose_buffers() {
  for (int i = 0; i < 3; i++) g_sink = memset(malloc(200), 0, 200);
  g_sink = nullptr;
}
NOINLINE static void held_by_old() { g_holder[0] = memset(malloc(1016), 0, 1016); }
NOINLINE static void lost_through_old() {
  g_doomed[0] = memset(malloc(1032), 0, 1032);
  g_doomed = nullptr;
}
NOINLINE static void lost_after() {
  for (int i = 0; i < 2; i++) g_sink = memset(malloc(1048), 0, 1048);
  g_sink = nullptr;
}

int main() {
  lose_widgets();
  lose_buffers();
  g_holder = static_cast<void**>(calloc(1, 64));
  g_doomed = static_cast<void**>(calloc(1, 72));
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "more")) {
      held_by_old();
      lost_through_old();
      lost_after();
    }
    harness_done();
  }
  return 0;
}
