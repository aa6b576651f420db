/* The main thread blocks while holding the main arena's lock: malloc_stats() prints under that
 * lock, to a stderr that is a full pipe nobody reads. A worker keeps allocating (in an arena of
 * its own); a third thread answers commands. dlopen run on the main thread would deadlock. */
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include "harness.h"

static volatile long rounds;

static void* worker(void* arg) {
  (void)arg;
  for (;;) {
    free(malloc(100));
    __atomic_fetch_add(&rounds, 1, __ATOMIC_RELAXED);
    usleep(2000);
  }
  return 0;
}

static void* commands(void* arg) {
  (void)arg;
  harness_serve_rounds(&rounds);
  exit(0);
}

int main(void) {
  int p[2];
  if (pipe(p) != 0) return 2;
  fcntl(p[1], F_SETFL, O_NONBLOCK);
  static char junk[4096];
  while (write(p[1], junk, sizeof junk) > 0) {}  /* fill the pipe */
  fcntl(p[1], F_SETFL, 0);
  dup2(p[1], 2);
  pthread_t w, c;
  pthread_create(&w, 0, worker, 0);
  usleep(20000);  /* the worker has its own arena by now */
  pthread_create(&c, 0, commands, 0);
  malloc_stats();  /* blocks in write(2) with the main arena locked */
  return 0;
}
