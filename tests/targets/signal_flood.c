/* A program flooded with signals from outside while memhook attaches and detaches: SIGPIPE
 * (ignored, as servers do) and SIGUSR1 (counted by a handler). The main thread computes outside
 * libc and allocates once a round; a second thread answers "rounds" (and "signals"). A signal
 * that stopped one of GDB's calls into it mid-call once left it to crash in the loader. */
#include <pthread.h>
#include <signal.h>
#include "harness.h"

static volatile long rounds, handled;

static void on_usr1(int s) {
  (void)s;
  handled++;
}

static void* commands(void* arg) {
  (void)arg;
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "rounds")) printf("rounds %ld\n", rounds);
    if (!strcmp(cmd, "signals")) printf("signals %ld\n", handled);
    harness_done();
  }
  exit(0);
}

int main(void) {
  signal(SIGUSR1, on_usr1);
  signal(SIGPIPE, SIG_IGN);
  sigset_t usr1;  /* (the handler runs on the main thread: the other one blocks it) */
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigaddset(&usr1, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &usr1, 0);
  pthread_t c;
  pthread_create(&c, 0, commands, 0);
  pthread_sigmask(SIG_UNBLOCK, &usr1, 0);
  volatile unsigned long x = 0;
  for (;;) {
    for (int k = 0; k < 200000; k++) x += (unsigned long)k * (unsigned long)rounds;
    free(malloc(64 + rounds % 64));
    __atomic_fetch_add(&rounds, 1, __ATOMIC_RELAXED);
  }
}
