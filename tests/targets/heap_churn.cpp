/* Four threads replacing polymorphic objects at full speed, with a malloc'd buffer of a random
 * size around each replacement: a heap that changes under a census. Each thread holds kSlots
 * Churn objects once warmed up, so the live count is 4 x kSlots (less the few being replaced).
 * Commands: "tally" prints that count, "rounds" the replacements so far. */
#include <pthread.h>
#include <stdlib.h>

#include "harness.h"

struct Churn {
  virtual ~Churn() {}
  virtual int id() const { return 7; }
  long payload[5];
};

enum { kThreads = 4, kSlots = 5000 };
static volatile long rounds;

static void* worker(void* arg) {
  unsigned seed = (unsigned)(long)arg;
  Churn* slots[kSlots];
  for (auto& s : slots) s = new Churn();
  for (;;) {
    int i = rand_r(&seed) % kSlots;
    void* scratch = malloc(16 + rand_r(&seed) % 2000);
    delete slots[i];
    slots[i] = new Churn();
    free(scratch);
    __atomic_add_fetch(&rounds, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

int main() {
  pthread_t t[kThreads];
  for (long i = 0; i < kThreads; i++) pthread_create(&t[i], NULL, worker, (void*)(i + 1));
  while (__atomic_load_n(&rounds, __ATOMIC_RELAXED) < 100000) usleep(1000);
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "tally")) printf("tally %d\n", kThreads * kSlots);
    if (!strcmp(cmd, "rounds")) printf("rounds %ld\n", rounds);
    harness_done();
  }
  return 0;
}
