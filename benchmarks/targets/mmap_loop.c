/* The cost of the mapping hooks: "run N SIZE" maps SIZE bytes anonymously, touches one byte,
 * and unmaps them, N times; prints "ns" per map-and-unmap pair. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

__attribute__((noinline)) static char* map_some(size_t n) {
  return mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

int main(void) {
  char cmd[64];
  printf("ready\n");
  fflush(stdout);
  while (fgets(cmd, sizeof cmd, stdin)) {
    long n = 0, size = 0;
    if (sscanf(cmd, "run %ld %ld", &n, &size) == 2) {
      long long t0 = now_ns();
      for (long i = 0; i < n; i++) {
        char* p = map_some((size_t)size);
        p[0] = 1;
        munmap(p, (size_t)size);
      }
      printf("ns %.1f\n", (double)(now_ns() - t0) / n);
    }
    if (!strncmp(cmd, "exit", 4)) break;
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
