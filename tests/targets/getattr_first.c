/* A thread whose first allocation once memhook is attached is made inside pthread_getattr_np,
 * which holds the thread's own lock around its realloc (the JVM asks at every thread's start).
 * "getattr" makes the idle thread ask, and prints "stack SIZE" when it has: a hook that asked
 * pthread_getattr_np for the thread's stack bounds there waited for itself, for ever. */
#include <pthread.h>
#include "harness.h"

static int go[2], back[2];

NOINLINE static size_t ask_stack(void) {
  pthread_attr_t attr;
  void* addr;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    pthread_attr_getstack(&attr, &addr, &size);
    pthread_attr_destroy(&attr);
  }
  return size;
}

NOINLINE static void* worker(void* arg) {
  char c;
  while (read(go[0], &c, 1) == 1) {
    size_t size = ask_stack();
    if (write(back[1], &size, sizeof size) != sizeof size) break;
  }
  return NULL;
}

int main(void) {
  pthread_t t;
  char cmd[64];
  if (pipe(go) || pipe(back) || pthread_create(&t, NULL, worker, NULL)) return 1;
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "getattr")) {
      size_t size = 0;
      if (write(go[1], "g", 1) != 1 || read(back[0], &size, sizeof size) != sizeof size) return 1;
      printf("stack %zu\n", size);
    }
    harness_done();
  }
  return 0;
}
