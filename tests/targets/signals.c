/* A SIGALRM handler that allocates, firing every 200 us, interrupts the main thread's
 * allocations (and so the hooks around them). Every block carries a pattern that is checked
 * before it is freed; "go" leaks 50 blocks of 333 bytes from main_leak. */
#include <time.h>
#include <signal.h>
#include <sys/time.h>
#include "harness.h"

static volatile long handled, corrupt;

static void on_alarm(int sig) {
  (void)sig;
  unsigned char* p = malloc(48);  /* not async-signal-safe in general; memhook must cope */
  memset(p, 0x5a, 48);
  for (int i = 0; i < 48; i++) if (p[i] != 0x5a) corrupt = 1;
  free(p);
  handled++;
}

NOINLINE static void main_leak(void) { for (int i = 0; i < 50; i++) memset(malloc(333), 3, 333); }

NOINLINE static void extra_alloc(int i) {
  size_t n = 16 + i % 200;
  unsigned char* p = malloc(n);
  memset(p, (unsigned char)n, n);
  for (size_t j = 0; j < n; j++) if (p[j] != (unsigned char)n) corrupt = 1;
  free(p);
}

/* Until the handler has run 200 times (a fast machine finishes churn() in fewer ticks), at most
 * 5 s: more allocations for it to interrupt, from a site of their own. */
NOINLINE static void more_allocs(void) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; handled < 200; i++) {
    extra_alloc(i);
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 5) break;
  }
}

NOINLINE static void churn(void) {
  for (int i = 0; i < 200000; i++) {
    size_t n = 16 + i % 200;
    unsigned char* p = malloc(n);
    memset(p, (unsigned char)n, n);
    for (size_t j = 0; j < n; j++) if (p[j] != (unsigned char)n) corrupt = 1;
    free(p);
  }
}

int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_alarm;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, 0);
  struct itimerval it = {{0, 200}, {0, 200}};
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "go")) {
      setitimer(ITIMER_REAL, &it, 0);
      churn();
      more_allocs();
      main_leak();
      struct itimerval off = {{0, 0}, {0, 0}};
      setitimer(ITIMER_REAL, &off, 0);
      printf("handled %ld corrupt %ld\n", handled, corrupt);
    }
    harness_done();
  }
  return (int)corrupt;
}
