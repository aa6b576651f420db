/* Blocks whose reachability is known (issue 44), each case from its own function and of its own
 * size, so that a report's sites can be checked against valgrind's and LeakSanitizer's words:
 *   "lost_list"    a 3-node list whose head pointer is overwritten: head definitely lost (1001 B),
 *                  the two nodes after it indirectly (1002 B each);
 *   "lost_cycle"   three blocks pointing round (1003 B): one definitely lost, two indirectly;
 *   "global"       held by a global (1004 B): reachable;
 *   "interior"     held only by a pointer 16 bytes into it (1005 B): possibly lost;
 *   "xored"        its pointer kept XOR-ed (1006 B): definitely lost;
 *   "thread_stack" held only by a local of a thread blocked in read() (1007 B): reachable;
 *   "tls"          held only by a __thread variable of another thread (1008 B): reachable;
 *   "register"     held only in a callee-saved register of a thread blocked in read() (1009 B);
 *   "tree"         a lost tree: root 1010 B definitely, 2 children 1011 B indirectly;
 *   "held_list"    a list held by a global (1012 B each x3): reachable.
 * Run with "exit-report" it exits after "exit" (valgrind and LSan report at exit); the threads'
 * blocks are then still held by the blocked threads. */
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include "harness.h"

struct node { struct node* next; char pad[1]; };

static void* volatile g_global;
static void* volatile g_interior;
static uintptr_t volatile g_xored;
static struct node* volatile g_list;
static int pipe_fds[2];
static sem_t started;
static __thread void* volatile t_held;

NOINLINE static struct node* node(size_t size, struct node* next) {
  struct node* n = malloc(size);
  memset(n, 0, size);
  n->next = next;
  return n;
}

NOINLINE static void lost_list(void) {
  g_list = node(1001, node(1002, node(1002, NULL)));
  g_list = NULL;
}
NOINLINE static void lost_cycle(void) {
  struct node* a = node(1003, NULL);
  struct node* b = node(1003, a);
  struct node* c = node(1003, b);
  a->next = c;
  __asm__ volatile("" ::"r"(a) : "memory");
}
NOINLINE static void global(void) { g_global = memset(malloc(1004), 0, 1004); }
NOINLINE static void interior(void) { g_interior = (char*)memset(malloc(1005), 0, 1005) + 16; }
NOINLINE static void xored(void) {
  g_xored = (uintptr_t)memset(malloc(1006), 0, 1006) ^ (uintptr_t)0x5a5a5a5a5a5a5a5aull;
}
NOINLINE static void tree(void) {
  struct node* root = node(1010, NULL);
  void** kids = (void**)root;
  kids[0] = node(1011, NULL);
  kids[1] = node(1011, NULL);
  __asm__ volatile("" ::"r"(root) : "memory");
}
NOINLINE static void held_list(void) {
  g_list = node(1012, node(1012, node(1012, NULL)));
}

/* A thread that allocates, keeps the block in a local on its stack, says so, and blocks. */
NOINLINE static void* stack_holder(void* arg) {
  void* volatile mine = memset(malloc(1007), 0, 1007);
  char c;
  sem_post(&started);
  if (read(pipe_fds[0], &c, 1) < 0) return NULL;
  return (void*)mine;
}
NOINLINE static void* tls_holder(void* arg) {
  t_held = memset(malloc(1008), 0, 1008);
  char c;
  sem_post(&started);
  if (read(pipe_fds[0], &c, 1) < 0) return NULL;
  return NULL;
}
/* The block's address only in rbx (callee-saved, kept across the system call), overwritten in
 * memory first. */
NOINLINE static void* register_holder(void* arg) {
  void* p = memset(malloc(1009), 0, 1009);
  char c;
  sem_post(&started);
  register void* held __asm__("rbx") = p;
  p = NULL;
  __asm__ volatile("" : "+r"(held));
  long r;
  __asm__ volatile("syscall"
                   : "=a"(r)
                   : "a"(0L), "D"((long)pipe_fds[0]), "S"(&c), "d"(1L), "r"(held)
                   : "rcx", "r11", "memory");
  __asm__ volatile("" ::"r"(held));
  return NULL;
}

static pthread_t threads[3];
static int nthreads;

NOINLINE static void start(void* (*fn)(void*)) {
  pthread_create(&threads[nthreads++], NULL, fn, NULL);
}

int main(void) {
  char cmd[64];
  if (pipe(pipe_fds) || sem_init(&started, 0, 0)) return 1;
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "all")) {
      lost_list();
      lost_cycle();
      global();
      interior();
      xored();
      tree();
      held_list();
      start(stack_holder);
      start(tls_holder);
      start(register_holder);
      for (int i = 0; i < 3; i++) sem_wait(&started);
    }
    harness_done();
  }
  /* The threads go on blocking: valgrind and LSan look at exit, as memhook at detach. */
  return 0;
}
