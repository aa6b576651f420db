/* When a program's first allocation happens: a constructor (run before main, as memhook run
 * must trace) mallocs 16 bytes and prints "first NS", CLOCK_REALTIME at that moment; then the
 * program exits. benchmarks/run_mode.py compares it with the time the program was started. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void* first_block;

__attribute__((constructor)) static void first(void) {
  first_block = malloc(16);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  printf("first %llu\n", (unsigned long long)ts.tv_sec * 1000000000ull + ts.tv_nsec);
  fflush(stdout);
}

int main(void) { return first_block == NULL; }
