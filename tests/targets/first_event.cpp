/* Threads whose first event in a session is operator new[], which reaches operator new through
 * libstdc++'s own (hooked) slot: a guard inside a guard, on the call that claims the thread's
 * ring. "go" starts THREADS threads that each leak one new[] of 100 bytes and churn a little. */
#include <pthread.h>
#include "harness.h"

#define THREADS 8

NOINLINE static void* first_new_array(void*) {
  char* keep = new char[100];
  keep[0] = 1;
  for (int i = 0; i < 1000; i++) delete[] new char[16 + i % 64];
  return keep;
}

int main() {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "go")) {
      pthread_t t[THREADS];
      for (int i = 0; i < THREADS; i++) pthread_create(&t[i], 0, first_new_array, 0);
      for (int i = 0; i < THREADS; i++) pthread_join(t[i], 0);
    }
    harness_done();
  }
  return 0;
}
