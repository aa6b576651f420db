/* A C program (no libstdc++) for the life of a session: blocks allocated before attach and
 * freed after, a size sweep for the filter, and a C++ plugin dlopen'ed (lazily bound) and
 * dlclose'd while attached. argv[1] is the plugin's path. */
#include <dlfcn.h>
#include <sys/wait.h>
#include "harness.h"

#define EARLY 50
static void* early[EARLY];
static void* plugin;

NOINLINE static void early_alloc(void) { for (int i = 0; i < EARLY; i++) early[i] = malloc(64); }
NOINLINE static void early_free(void) { for (int i = 0; i < EARLY; i++) free(early[i]); }
NOINLINE static void late_leak(void) { for (int i = 0; i < 7; i++) memset(malloc(99), 1, 99); }
NOINLINE static void sized_allocs(void) {
  static const size_t sizes[] = {100, 1023, 1024, 5000, 65536, 65537, 1 << 20};
  for (int r = 0; r < 3; r++)
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) memset(malloc(sizes[i]), 1, 1);
}
NOINLINE static void deep(int n) {
  if (n == 0)
    for (int i = 0; i < 40; i++) memset(malloc(77), 1, 1);  /* one stack, 40 times */
  else deep(n - 1);
  __asm__ volatile("" ::: "memory");  /* not a tail call: every level keeps its frame */
}
/* Inlined into its caller: the report shows both, the inlined call marked as such. */
static inline __attribute__((always_inline)) void* make_buffer(size_t n) {
  return malloc(n);
}
NOINLINE static void inlined_leak(void) {
  for (int i = 0; i < 3; i++) memset(make_buffer(88), 1, 1);
}
/* Who frees: the allocating call itself, a callee while that call is active, or its caller
 * after it returned. */
NOINLINE static void scratch_in_call(void) {
  for (int i = 0; i < 10; i++) { char* p = malloc(300); memset(p, 1, 300); free(p); }
}
NOINLINE static void release(char* p) { free(p); }
NOINLINE static void freed_deeper(void) {
  for (int i = 0; i < 10; i++) { char* p = malloc(500); memset(p, 1, 500); release(p); }
}
NOINLINE static char* factory(void) { char* p = malloc(400); memset(p, 1, 400); return p; }
NOINLINE static void freed_by_caller(void) {
  for (int i = 0; i < 10; i++) { char* p = factory(); p[1] = 2; free(p); }
}
/* Two paths to one call site through frames of the same sizes: at the malloc, the stack pointer,
 * the frame pointer and the return address are the same on both; only the return addresses
 * further up differ (the hooks' stack slots must tell them apart). */
static int twin_grow; /* the block is allocated small and grown by realloc to its size */
NOINLINE static void twin_leaf(size_t n) {
  char* p = malloc(twin_grow ? 8 : n);
  if (twin_grow) p = realloc(p, n);
  memset(p, 1, 1);
}
NOINLINE static void twin_mid(size_t n) { twin_leaf(n); __asm__ volatile("" ::: "memory"); }
NOINLINE static void twin_a(void) { twin_mid(111); __asm__ volatile("" ::: "memory"); }
NOINLINE static void twin_b(void) { twin_mid(222); __asm__ volatile("" ::: "memory"); }
/* Overload: blocks held, then (memhook stopped) a flood of leaked allocations that fills the
 * ring, then the held blocks freed or moved by realloc. */
#define HELD 300
#define FLOOD 3000
static void* held[HELD];
NOINLINE static void hold_blocks(void) { for (int i = 0; i < HELD; i++) held[i] = malloc(48); }
NOINLINE static void flood_leak(void) { for (int i = 0; i < FLOOD; i++) memset(malloc(16), 1, 1); }
NOINLINE static void release_held(void) { for (int i = 0; i < HELD; i++) free(held[i]); }
NOINLINE static void regrow_held(void) {
  for (int i = 0; i < HELD; i++) held[i] = realloc(held[i], 4000);
}
/* More held blocks than a full ring has room to free: most of their frees are dropped. */
#define MANY 2000
static void* many[MANY];
NOINLINE static void hold_many(void) { for (int i = 0; i < MANY; i++) many[i] = malloc(40); }
NOINLINE static void release_many(void) { for (int i = 0; i < MANY; i++) free(many[i]); }
NOINLINE static void regrow_many(void) {
  for (int i = 0; i < MANY; i++) many[i] = realloc(many[i], 3000);
}
NOINLINE static void second_leak(void) { for (int i = 0; i < 4; i++) memset(calloc(1, 4321), 1, 1); }

int main(int argc, char** argv) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "early")) early_alloc();
    else if (!strcmp(cmd, "go")) { early_free(); late_leak(); }
    else if (!strcmp(cmd, "sizes")) sized_allocs();
    else if (!strcmp(cmd, "second")) second_leak();
    else if (!strcmp(cmd, "deep")) deep(60);
    else if (!strcmp(cmd, "twins") || !strcmp(cmd, "twins_grow")) {
      twin_grow = !strcmp(cmd, "twins_grow");
      for (int i = 0; i < 300; i++) { twin_a(); if (i < 200) twin_b(); }
    }
    else if (!strcmp(cmd, "inlined")) inlined_leak();
    else if (!strcmp(cmd, "calls")) { scratch_in_call(); freed_deeper(); freed_by_caller(); }
    else if (!strcmp(cmd, "fork")) {
      /* The child allocates through the same (patched) slots, frees, and exits; the parent
       * leaks 5 x 111 around it. */
      memset(malloc(111), 1, 1);
      pid_t child = fork();
      if (child == 0) {
        for (int i = 0; i < 10000; i++) free(malloc(64 + i % 64));
        void* keep = malloc(2222);
        memset(keep, 2, 2222);
        _exit(0);
      }
      for (int i = 0; i < 4; i++) memset(malloc(111), 1, 1);
      int status = 0;
      waitpid(child, &status, 0);
      printf("child %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    } else if (!strcmp(cmd, "storm")) {
      /* 100 children, half of them exec'ing, all allocating through the patched slots. */
      int failed = 0;
      for (int i = 0; i < 100; i++) {
        pid_t child = fork();
        if (child == 0) {
          for (int j = 0; j < 100; j++) free(malloc(16 + j));
          if (i % 2) execl("/bin/true", "true", (char*)0);
          _exit(0);
        }
        memset(malloc(123), 1, 1);
        int status = 0;
        waitpid(child, &status, 0);
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
      }
      printf("storm %d\n", failed);
    } else if (!strcmp(cmd, "exec")) {
      execl("/bin/sleep", "sleep", "30", (char*)0);
    }
    else if (!strcmp(cmd, "hold")) hold_blocks();
    else if (!strcmp(cmd, "flood")) flood_leak();
    else if (!strcmp(cmd, "release")) release_held();
    else if (!strcmp(cmd, "regrow")) regrow_held();
    else if (!strcmp(cmd, "hold_many")) hold_many();
    else if (!strcmp(cmd, "release_many")) release_many();
    else if (!strcmp(cmd, "regrow_many")) regrow_many();
    else if (!strcmp(cmd, "churn"))
      for (int i = 0; i < 20000; i++) free(malloc(32 + i % 100));
    else if (!strcmp(cmd, "load")) {
      plugin = dlopen(argv[1], RTLD_LAZY);
      if (!plugin) { fprintf(stderr, "%s\n", dlerror()); return 2; }
      ((void (*)(void))dlsym(plugin, "plugin_work"))();
    } else if (!strcmp(cmd, "unload")) dlclose(plugin);
    else if (!strcmp(cmd, "stdcxx")) {
      FILE* f = fopen("/proc/self/maps", "r");
      char line[512]; int found = 0;
      while (fgets(line, sizeof line, f)) found |= strstr(line, "libstdc++") != 0;
      fclose(f);
      printf("stdcxx %d\n", found);
    }
    harness_done();
  }
  return 0;
}
