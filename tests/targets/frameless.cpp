/* Leaks behind frameless code, for memhook's whole-stack tests: compiled -O2
 * -fomit-frame-pointer, each leak reached through a chain of at least eight frameless
 * functions (template instances, static helpers, one with alloca, whose CFA is rbp-based),
 * then through glibc's and libstdc++'s own frameless allocating functions. Commands:
 *   strdup N | getline | asprintf N | string N | vector N | new N | lib N   one leak
 *   signal N   a SIGUSR1 handler on an alternate stack leaks strdup(N - 1 chars)
 *   thread N   a new thread leaks strdup(N - 1 chars) through the chain (its first event)
 *   dlopen PATH | plugin N                 load a (frameless) library later, then leak in it
 *   dlleak PATH N   load it and leak in it at once (before memhook can have its rows)
 *   dlmopen PATH    load it with dlmopen (in the base namespace): no dlopen hook sees it
 *   jit N | jitbare N   leak N bytes from code in anonymous memory (JIT code, no unwind
 *                       information) that keeps a frame pointer, or that zeroes rbp
 * Everything leaked is kept: the report's bytes are known. */
#include <alloca.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>

#include <string>
#include <vector>

#include "harness.h"

extern "C" void lib_leak_strdup(int n);

static volatile int sink;
static void* kept[1 << 16];
static int nkept;
static void keep(void* p) { kept[nkept++ % (1 << 16)] = p; }

typedef void (*Leaf)(int);

/* Eight frames of templates: each a function of its own, none keeps a frame pointer, and the
 * work after each call keeps it a call (no tail call). */
template <int N>
struct Chain {
  NOINLINE static void run(Leaf leaf, int n) {
    Chain<N - 1>::run(leaf, n + sink * 0);
    sink++;
  }
};
template <>
struct Chain<0> {
  NOINLINE static void run(Leaf leaf, int n);
};

/* A variable-length frame: the compiler keeps rbp here, and CFI says CFA = rbp + 16. */
NOINLINE static void with_alloca(Leaf leaf, int n) {
  char* scratch = (char*)alloca(16 + (n & 63));
  scratch[0] = (char)n;
  sink += scratch[0];
  leaf(n);
  sink++;
}
NOINLINE void Chain<0>::run(Leaf leaf, int n) {
  with_alloca(leaf, n);
  sink++;
}

NOINLINE static void leak_strdup(int n) {
  static char s[1 << 16];
  memset(s, 's', n - 1);
  s[n - 1] = 0;
  keep(strdup(s));
  sink++;
}

static FILE* lines;
NOINLINE static void leak_getline(int) {
  char* line = NULL;
  size_t cap = 0;
  rewind(lines);
  if (getline(&line, &cap, lines) > 0) keep(line);
  sink++;
}

NOINLINE static void leak_asprintf(int n) {
  char* p = NULL;
  if (asprintf(&p, "%0*d", n - 1, 0) >= 0) keep(p);
  sink++;
}

NOINLINE static void leak_string(int n) {
  std::string* s = new std::string;
  for (int i = 0; i < n; i++) s->push_back('x');
  keep(s);
  sink++;
}

NOINLINE static void leak_vector(int n) {
  std::vector<long>* v = new std::vector<long>;
  for (int i = 0; i < n; i++) v->push_back(i);
  keep(v);
  sink++;
}

NOINLINE static void leak_new(int n) {
  keep(new char[n]);
  sink++;
}

NOINLINE static void leak_lib(int n) {
  lib_leak_strdup(n);
  sink++;
}

static int signal_bytes;
static void on_usr1(int) { leak_strdup(signal_bytes); }
NOINLINE static void leak_in_handler(int n) {
  signal_bytes = n;
  raise(SIGUSR1);
  sink++;
}

/* A thread started for the command: its stack is its own mapping, found at its first event. */
NOINLINE static void leak_in_thread(int n) {
  leak_strdup(n);
  sink++;
}
static void* thread_main(void* arg) {
  Chain<8>::run(leak_in_thread, (int)(intptr_t)arg);
  return NULL;
}
NOINLINE static void leak_thread(int n) {
  pthread_t t;
  if (pthread_create(&t, NULL, thread_main, (void*)(intptr_t)n) == 0) pthread_join(t, NULL);
}

static void (*plugin_leak)(int);
/* JIT code: copied into anonymous executable memory, it calls jit_alloc(n) through the
 * pointer in %rsi. With a frame pointer (push rbp; mov rsp, rbp) or with rbp zeroed. */
static const unsigned char jit_with_fp[] = {0x55, 0x48, 0x89, 0xe5, 0xff, 0xd6, 0x5d, 0xc3};
static const unsigned char jit_bare[] = {0x55, 0x31, 0xed, 0xff, 0xd6, 0x5d, 0xc3};
typedef void* (*JitFn)(size_t, void* (*)(size_t));
NOINLINE static void* jit_alloc(size_t n) {
  void* p = malloc(n);
  sink++;
  return p;
}
static JitFn jit_code(const unsigned char* code, size_t len) {
  void* m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memcpy(m, code, len);
  mprotect(m, 4096, PROT_READ | PROT_EXEC);
  return (JitFn)m;
}
NOINLINE static void leak_jit(int n) {
  static JitFn f = jit_code(jit_with_fp, sizeof jit_with_fp);
  keep(f(n, jit_alloc));
  sink++;
}
NOINLINE static void leak_jit_bare(int n) {
  static JitFn f = jit_code(jit_bare, sizeof jit_bare);
  keep(f(n, jit_alloc));
  sink++;
}

NOINLINE static void leak_plugin(int n) {
  plugin_leak(n);
  sink++;
}

int main() {
  static char text[] = "a line for getline\n";
  lines = fmemopen(text, sizeof text - 1, "r");
  stack_t ss = {};
  ss.ss_size = 1 << 16;
  ss.ss_sp = malloc(ss.ss_size);
  sigaltstack(&ss, NULL);
  struct sigaction sa = {};
  sa.sa_handler = on_usr1;
  sa.sa_flags = SA_ONSTACK;
  sigaction(SIGUSR1, &sa, NULL);
  harness_ready();
  char cmd[4096], word[64];
  while (harness_next(cmd, sizeof cmd)) {
    int n = 0;
    char path[4000] = "";
    sscanf(cmd, "%63s %d", word, &n);
    Leaf leaf = NULL;
    if (!strcmp(word, "strdup")) leaf = leak_strdup;
    else if (!strcmp(word, "getline")) leaf = leak_getline;
    else if (!strcmp(word, "asprintf")) leaf = leak_asprintf;
    else if (!strcmp(word, "string")) leaf = leak_string;
    else if (!strcmp(word, "vector")) leaf = leak_vector;
    else if (!strcmp(word, "new")) leaf = leak_new;
    else if (!strcmp(word, "lib")) leaf = leak_lib;
    else if (!strcmp(word, "signal")) leaf = leak_in_handler;
    else if (!strcmp(word, "plugin")) leaf = leak_plugin;
    else if (!strcmp(word, "jit")) leaf = leak_jit;
    else if (!strcmp(word, "jitbare")) leaf = leak_jit_bare;
    if (!strcmp(word, "thread")) {
      leak_thread(n);
    } else if (leaf) {
      Chain<8>::run(leaf, n);
    } else if (!strcmp(word, "dlleak") && sscanf(cmd, "%*s %3999s %d", path, &n) == 2) {
      void* h = dlopen(path, RTLD_NOW);
      plugin_leak = h ? (void (*)(int))dlsym(h, "lib_leak_strdup") : NULL;
      if (plugin_leak) Chain<8>::run(leak_plugin, n);
    } else if (!strcmp(word, "dlmopen") && sscanf(cmd, "%*s %3999s", path) == 1) {
      void* h = dlmopen(LM_ID_BASE, path, RTLD_NOW);
      plugin_leak = h ? (void (*)(int))dlsym(h, "lib_leak_strdup") : NULL;
      if (!plugin_leak) printf("dlmopen failed: %s\n", dlerror());
    } else if (!strcmp(word, "dlopen") && sscanf(cmd, "%*s %3999s", path) == 1) {
      void* h = dlopen(path, RTLD_NOW);
      plugin_leak = h ? (void (*)(int))dlsym(h, "lib_leak_strdup") : NULL;
      if (!plugin_leak) printf("dlopen failed: %s\n", dlerror());
    }
    harness_done();
  }
  return 0;
}
