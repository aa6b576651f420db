/* A thread stopped inside a signal handler that runs on an alternate stack malloc gave (a
 * block in the heap), for the leak check's roots. "all":
 *   on_altstack: the handler allocates a 1017-byte block, keeps it only in a local on the
 *                alternate stack, and blocks in read(): reachable;
 *   lost_above:  a 1018-byte block the thread allocated after its alternate stack (above it
 *                in its arena's heap), its pointer dropped: definitely lost; it holds the only
 *                pointer to a 1019-byte block (lost_below): indirectly lost (the heap above a
 *                stack pointer in it is no stack, whose words would reach it). */
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include "harness.h"

static int pipe_fds[2];
static sem_t in_handler;
static void* volatile sink;

NOINLINE static void on_altstack(int sig) {
  void* volatile mine = memset(malloc(1017), 0, 1017);
  char c;
  sem_post(&in_handler);
  if (read(pipe_fds[0], &c, 1) < 0) sink = (void*)mine;
}

NOINLINE static void* lost_below(void) { return memset(malloc(1019), 0, 1019); }
NOINLINE static void lost_above(void) {
  void** a = memset(malloc(1018), 0, 1018);
  a[0] = lost_below();
  sink = a;
  sink = NULL;
}

/* The stack below this thread's frames, where lost_above's pointer lingered: cleared. (Its
 * interrupted stack is read whole while it runs on the alternate stack: stale words count.) */
NOINLINE static void scrub(void) {
  volatile char junk[16384];
  memset((char*)junk, 0, sizeof junk);
}

NOINLINE static void* holder(void* arg) {
  stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16, .ss_flags = 0};
  lost_above();  /* (in this thread's arena, above its alternate stack) */
  scrub();
  sigaltstack(&ss, NULL);
  sem_post(&in_handler);  /* (its alternate stack set) */
  for (;;) pause();
  return NULL;
}

int main(void) {
  char cmd[64];
  pthread_t t;
  struct sigaction sa = {.sa_handler = on_altstack, .sa_flags = SA_ONSTACK};
  if (pipe(pipe_fds) || sem_init(&in_handler, 0, 0) || sigaction(SIGUSR1, &sa, NULL)) return 1;
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "all")) {
      pthread_create(&t, NULL, holder, NULL);
      sem_wait(&in_handler);
      pthread_kill(t, SIGUSR1);
      sem_wait(&in_handler);
    }
    harness_done();
  }
  return 0;
}
