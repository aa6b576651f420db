/* Frees in batches, as a garbage collector's cleaner or a pool drained now and then does: "run
 * MS K" allocates K 512-byte blocks from batch_alloc every millisecond for MS milliseconds and
 * every 200 ms frees nine in ten of those allocated since, keeping the tenth in a global list:
 * most of its blocks are freed, yet what it holds after each batch keeps rising (issue 44,
 * point 10). A busy start (K large, then small) makes its early peaks higher than anything it
 * holds at the end. */
#include <time.h>
#include "harness.h"

#define MAX_BLOCKS 100000
static void* pending[MAX_BLOCKS];
static void* kept[MAX_BLOCKS];
static int npending, nkept;

NOINLINE static void* batch_alloc(void) { return memset(malloc(512), 1, 512); }

static void drain(void) {
  for (int i = 0; i < npending; i++) {
    if (i % 10 == 9 && nkept < MAX_BLOCKS) kept[nkept++] = pending[i];
    else free(pending[i]);
  }
  npending = 0;
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    int ms = 0, k = 0;
    if (sscanf(cmd, "run %d %d", &ms, &k) == 2) {
      struct timespec tick = {0, 1000000};
      for (int t = 1; t <= ms && npending + k <= MAX_BLOCKS; t++) {
        for (int i = 0; i < k; i++) pending[npending++] = batch_alloc();
        if (t % 200 == 0) drain();
        nanosleep(&tick, NULL);
      }
    }
    harness_done();
  }
  return 0;
}
