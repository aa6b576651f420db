/* For tests/unit/test_resident.py: two named threads that allocated in arenas of their own,
 * 64 MiB mapped anonymously with half of it touched; then everything waits. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static pthread_barrier_t ready;

static void* worker(void* arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "worker");
  for (int i = 0; i < 1000; i++) memset(malloc(1000), 1, 1000);
  pthread_barrier_wait(&ready);
  pause();
  return NULL;
}

int main(void) {
  pthread_t t[2];
  pthread_barrier_init(&ready, NULL, 3);
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, NULL);
  char* m = mmap(NULL, 64 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memset(m, 1, 32 << 20);
  pthread_barrier_wait(&ready);
  printf("ready\n");
  fflush(stdout);
  pause();
  return 0;
}
