/* The program's own free() (interposed: the hooks call it as the real one) blocks for 5 s once,
 * when called from memhook's hook, so a hook sits in the middle of an event that long while
 * another thread keeps allocating. "block" triggers it: fclose frees its FILE through libc's
 * own (hooked) slot. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include "harness.h"

extern void __libc_free(void*);
static volatile int block_next;

void free(void* p) {
  Dl_info info;
  if (block_next && dladdr(__builtin_return_address(0), &info) && info.dli_fname &&
      strstr(info.dli_fname, "memhook")) {
    block_next = 0;
    sleep(5);
  }
  __libc_free(p);
}

static void* worker(void* arg) {
  (void)arg;
  for (;;) {
    free(malloc(200));
    usleep(1000);
  }
  return 0;
}

int main(void) {
  pthread_t t;
  pthread_create(&t, 0, worker, 0);
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "block")) {
      block_next = 1;
      fclose(fopen("/dev/null", "r"));
    }
    harness_done();
  }
  return 0;
}
