/* Threads blocked in system calls the kernel restarts after a stop, for the leak check that has
 * one of them make a call of memhook's (reachability/forked_image.h): each must go on as if
 * nothing happened.
 *   sleeper: nanosleep() of 20 ms in a loop (-ERESTART_RESTARTBLOCK: restart_syscall); a sleep
 *            that ends early or fails is counted bad;
 *   reader:  read() from a pipe nobody writes to until "poke" (-ERESTARTSYS), then counts the
 *            byte it got; a read that fails is counted bad;
 *   pauser:  sigsuspend() waiting for SIGUSR1 (-ERESTARTNOHAND), which "wake" sends; counts
 *            the wake-ups;
 * "status" prints "bad N sleeps N got N woken N". Some blocks are lost on the way (lose). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include "harness.h"

static volatile long bad, sleeps, got, woken;
static int pipe_fds[2];
static pthread_t pauser_thread;

static long ns_since(const struct timespec* t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (t1.tv_sec - t0->tv_sec) * 1000000000L + (t1.tv_nsec - t0->tv_nsec);
}

NOINLINE static void* sleeper(void* arg) {
  for (;;) {
    struct timespec t0, d = {0, 20000000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (nanosleep(&d, NULL) != 0 || ns_since(&t0) < 20000000) bad++;
    sleeps++;
    if (sleeps % 8 == 0) free(malloc(64));  /* (events of its own, now and then) */
  }
  return NULL;
}

NOINLINE static void* reader(void* arg) {
  char c;
  for (;;) {
    const ssize_t n = read(pipe_fds[0], &c, 1);
    if (n == 1 && c == 'p') got++;
    else bad++;
  }
  return NULL;
}

static void on_usr1(int sig) { (void)sig; }

NOINLINE static void* pauser(void* arg) {
  sigset_t none;
  sigemptyset(&none);
  for (;;) {
    sigsuspend(&none);  /* returns -1 EINTR once the handler ran */
    woken++;
  }
  return NULL;
}

static void* volatile g_sink;
NOINLINE static void lose(void) {
  g_sink = malloc(777);
  g_sink = NULL;
}

int main(void) {
  char cmd[64];
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, NULL);  /* only the pauser takes it, in sigsuspend */
  signal(SIGUSR1, on_usr1);
  pthread_t t;
  if (pipe(pipe_fds) || pthread_create(&t, NULL, sleeper, NULL) ||
      pthread_create(&t, NULL, reader, NULL) || pthread_create(&pauser_thread, NULL, pauser, NULL))
    return 1;
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "poke")) {
      if (write(pipe_fds[1], "p", 1) != 1) return 1;
    } else if (!strcmp(cmd, "wake")) {
      pthread_kill(pauser_thread, SIGUSR1);
    } else if (!strcmp(cmd, "lose")) {
      lose();
    } else if (!strcmp(cmd, "status")) {
      printf("bad %ld sleeps %ld got %ld woken %ld\n", bad, sleeps, got, woken);
    }
    harness_done();
  }
  return 0;
}
