/* Worker threads allocate and free concurrently; half of every worker's blocks are freed by a
 * separate freer thread (cross-thread frees). Each worker also leaks LEAKS blocks of 1000+w
 * bytes. Every block carries a pattern that is checked before it is freed. */
#include <pthread.h>
#include "harness.h"

#define WORKERS 4
#define ITERS 20000
#define LEAKS 100
#define QCAP 1024

static void* queue[QCAP];
static int qhead, qtail, workers_left;
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcond = PTHREAD_COND_INITIALIZER;
static int corrupt;

/* A block starts with its size; the rest is a pattern derived from it. */
static void fill(unsigned char* p, size_t n) {
  *(size_t*)p = n;
  for (size_t i = 8; i < n; i++) p[i] = (unsigned char)(n + i);
}
static void check_and_free(unsigned char* p) {
  size_t n = *(size_t*)p;
  for (size_t i = 8; i < n; i++) if (p[i] != (unsigned char)(n + i)) corrupt = 1;
  free(p);
}

NOINLINE static void* churn_alloc(size_t n) { unsigned char* p = malloc(n); fill(p, n); return p; }
NOINLINE static void thread_leak(int w) {
  for (int i = 0; i < LEAKS; i++) fill(malloc(1000 + w), 1000 + w);
}

static void* worker(void* arg) {
  int w = (int)(long)arg;
  for (int i = 0; i < ITERS; i++) {
    size_t n = 16 + (i % 64);
    unsigned char* p = churn_alloc(n);
    if (i % 2) { check_and_free(p); continue; }
    pthread_mutex_lock(&qlock);
    while ((qtail + 1) % QCAP == qhead) pthread_cond_wait(&qcond, &qlock);
    queue[qtail] = p; qtail = (qtail + 1) % QCAP;
    pthread_cond_broadcast(&qcond);
    pthread_mutex_unlock(&qlock);
  }
  thread_leak(w);
  pthread_mutex_lock(&qlock);
  workers_left--;
  pthread_cond_broadcast(&qcond);
  pthread_mutex_unlock(&qlock);
  return 0;
}

static void* freer(void* arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&qlock);
    while (qhead == qtail && workers_left > 0) pthread_cond_wait(&qcond, &qlock);
    if (qhead == qtail) { pthread_mutex_unlock(&qlock); return 0; }
    void* p = queue[qhead]; qhead = (qhead + 1) % QCAP;
    pthread_cond_broadcast(&qcond);
    pthread_mutex_unlock(&qlock);
    check_and_free(p);
  }
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "go")) {
      pthread_t t[WORKERS], f;
      workers_left = WORKERS;
      for (long w = 0; w < WORKERS; w++) pthread_create(&t[w], 0, worker, (void*)w);
      pthread_create(&f, 0, freer, 0);
      for (int w = 0; w < WORKERS; w++) pthread_join(t[w], 0);
      pthread_join(f, 0);
    }
    harness_done();
  }
  return corrupt;
}
