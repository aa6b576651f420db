/* musl's allocation entry points called the way Alpine builds programs (-O2, no frame
 * pointers), each from a function of its own (tests/integration/test_libcs.py): musl's libc
 * has no call-frame information for them, and memhook derives their rows from their machine
 * code. Commands: strdup, getline, fopen; each keeps what it got; signal raises SIGUSR1, whose
 * handler keeps a malloc(901) (musl's __restore_rt has no call-frame information either). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))

void* kept[256];  /* (exported: the compiler keeps every store) */
int nkept;

NOINLINE void leak_strdup(void) { kept[nkept++ % 256] = strdup("a string musl duplicates"); }

NOINLINE void leak_getline(void) {
  char* line = NULL;
  size_t n = 0;
  FILE* f = fopen("/proc/self/comm", "r");
  if (f && getline(&line, &n, f) > 0) kept[nkept++ % 256] = line;
  if (f) fclose(f);
}

NOINLINE void leak_fopen(void) { kept[nkept++ % 256] = fopen("/dev/null", "r"); }

NOINLINE void on_usr1(int sig) { kept[nkept++ % 256] = malloc(900 + sig / sig); }

NOINLINE void leak_in_handler(void) {
  signal(SIGUSR1, on_usr1);
  raise(SIGUSR1);
}

int main(void) {
  char cmd[64];
  printf("ready\n");
  fflush(stdout);
  while (fgets(cmd, sizeof cmd, stdin)) {
    cmd[strcspn(cmd, "\n")] = 0;
    if (!strcmp(cmd, "exit")) break;
    if (!strcmp(cmd, "strdup")) leak_strdup();
    else if (!strcmp(cmd, "getline")) leak_getline();
    else if (!strcmp(cmd, "fopen")) leak_fopen();
    else if (!strcmp(cmd, "signal")) leak_in_handler();
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
