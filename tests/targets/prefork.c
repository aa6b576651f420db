/* A pre-forking server in miniature (nginx, php-fpm, PostgreSQL): the master forks workers on
 * "spawn" (answering "worker PID"); a worker leaks WORKER_LEAK bytes each time it gets SIGUSR1
 * and says "leaked PID N" (its N-th time); "leak" makes the master leak 5 x 111 bytes. Workers
 * forked while the master is traced inherit its patched slots. */
#include <signal.h>
#include "harness.h"

static volatile sig_atomic_t pending;
static void on_usr1(int sig) { (void)sig; pending++; }

NOINLINE static void worker_leak(void) { memset(malloc(4321), 1, 4321); }
NOINLINE static void master_leak(void) { for (int i = 0; i < 5; i++) memset(malloc(111), 1, 1); }

NOINLINE static void worker_main(void) {
  sigset_t usr1, old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigprocmask(SIG_BLOCK, &usr1, &old);
  for (int n = 0;;) {
    while (!pending) sigsuspend(&old);
    pending--;
    worker_leak();
    printf("leaked %d %d\n", (int)getpid(), ++n);
    fflush(stdout);
  }
}

int main(void) {
  signal(SIGUSR1, on_usr1);
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "spawn")) {
      pid_t child = fork();
      if (child == 0) worker_main();
      printf("worker %d\n", (int)child);
    } else if (!strcmp(cmd, "leak")) {
      master_leak();
    }
    harness_done();
  }
  return 0;
}
