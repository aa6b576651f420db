/* Stall detector: a thread wakes every millisecond and records the longest gap between two
 * wake-ups; while memhook (GDB) holds the process stopped, the gap grows by the pause.
 * Extra idle threads make attach realistic (GDB stops each one). Commands on stdin:
 * "reset" clears the maximum, "max" prints it in microseconds, "exit" ends. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stall_detector.h"

static void* idle(void* arg) {
  (void)arg;
  for (;;) {
    void* p = malloc(64);  /* a little allocation traffic through the hooks */
    free(p);
    usleep(10000);
  }
  return 0;
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 8;
  pthread_t t;
  pthread_create(&t, 0, detector, 0);
  for (int i = 0; i < threads; i++) pthread_create(&t, 0, idle, 0);
  char line[64];
  printf("ready %d\n", getpid());
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    if (!strncmp(line, "reset", 5)) max_gap_us = 0;
    else if (!strncmp(line, "max", 3)) printf("max %lld\n", (long long)max_gap_us);
    else if (!strncmp(line, "exit", 4)) break;
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
