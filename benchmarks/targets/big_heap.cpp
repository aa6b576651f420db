/* A big heap for the census benchmark: argv[1] blocks (default 10 M) of 24-232 bytes asked
 * (mean about 100), one in ten a polymorphic object, every fourth freed, in the main arena;
 * the heap is then over 1 GiB. A stall detector thread (stall_detector.h) records the longest
 * gap between its 1 ms wake-ups. Commands: "reset", "max" (the gap in microseconds), "heap" (bytes
 * of heap, from mallinfo2), "exit". */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct Node {
  virtual ~Node() {}
  virtual long weight() const { return 1; }
  long payload[6];
};

#include "stall_detector.h"

int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 10000000;
  void** blocks = (void**)calloc(n, sizeof(void*));
  unsigned seed = 1;
  for (long i = 0; i < n; i++) {
    if (i % 10 == 0) {
      blocks[i] = new Node();
    } else {
      size_t size = 24 + (rand_r(&seed) % 14) * 16;
      memset(blocks[i] = malloc(size), 1, size);
    }
  }
  for (long i = 0; i < n; i += 4) {
    if (i % 10 == 0) delete (Node*)blocks[i];
    else free(blocks[i]);
  }
  pthread_t t;
  pthread_create(&t, 0, detector, 0);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  char cmd[64];
  while (fgets(cmd, sizeof cmd, stdin)) {
    if (!strncmp(cmd, "reset", 5)) max_gap_us = 0;
    if (!strncmp(cmd, "max", 3)) printf("max %lld\n", (long long)max_gap_us);
    if (!strncmp(cmd, "heap", 4)) printf("heap %zu\n", mallinfo2().arena);
    if (!strncmp(cmd, "exit", 4)) break;
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
