/* Test targets are command loops on stdin: they print "ready PID", then for each command line
 * do some work and print "done"; "exit" ends them with status 0 (or 1 if they found their own
 * data corrupted). Everything they allocate is known, so reports can be checked to the byte. */
#ifndef MEMHOOK_TEST_HARNESS_H
#define MEMHOOK_TEST_HARNESS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static void harness_ready(void) {
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
}

/* Next command into buf (newline stripped); 0 at end of input or on "exit". */
static int harness_next(char* buf, int n) {
  if (!fgets(buf, n, stdin)) return 0;
  buf[strcspn(buf, "\n")] = 0;
  return strcmp(buf, "exit") != 0;
}

/* The stack below the caller's frame zeroed: pointers that calls of a command's work left there
 * (in frames the next fgets() reuses without writing every slot) are no roots a leak check can
 * trip on, whatever this glibc's stdio keeps uninitialised. */
NOINLINE static void harness_scrub(void) {
  volatile char junk[16384];
  memset((char*)junk, 0, sizeof junk);
}

static void harness_done(void) {
  printf("done\n");
  fflush(stdout);
}

/* Say ready, then answer "rounds" with *rounds until "exit" or the end of input. */
static void harness_serve_rounds(volatile long* rounds) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "rounds")) printf("rounds %ld\n", *rounds);
    harness_done();
  }
}
#endif
