/* Threads that do nothing but allocate and free, so that at any moment some are inside
 * malloc holding an arena lock; the main thread answers commands. */
#include <pthread.h>
#include "harness.h"

static volatile int stop;
static volatile long rounds;

static void* spin(void* arg) {
  (void)arg;
  while (!stop) {
    void* p[16];
    for (int i = 0; i < 16; i++) p[i] = malloc(16 + i * 40);
    for (int i = 0; i < 16; i++) free(p[i]);
    __atomic_fetch_add(&rounds, 1, __ATOMIC_RELAXED);
  }
  return 0;
}

static void* commands(void* arg) {
  (void)arg;
  harness_serve_rounds(&rounds);
  stop = 1;
  return 0;
}

/* The main thread spins too: GDB's default thread for a call is the one most likely to be
 * inside malloc. Commands are read by another thread. */
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  pthread_t t[16], c;
  for (int i = 0; i < n; i++) pthread_create(&t[i], 0, spin, 0);
  pthread_create(&c, 0, commands, 0);
  spin(0);
  for (int i = 0; i < n; i++) pthread_join(t[i], 0);
  pthread_join(c, 0);
  return 0;
}
