/* `memhook run` target (issue 34). Before main: launched_lib's constructor keeps 1111 bytes and
 * a static initializer here keeps 2222. Then argv[1]:
 *   exit N   leak 3 x 1000 bytes in leak_in_main, exit(N)
 *   lose     the same, every address dropped (definitely lost), return 0
 *   segv     leak 3 x 1000 bytes, then die of SIGSEGV
 *   stdin    each line read: kept (strlen + 1 bytes, in keep_line), written back upper-cased
 *   sigint   print "ready", wait for SIGINT, wait 0.5 s more for a second one, keep 4321
 *            bytes, exit 10 + the number of SIGINTs seen
 *   sigterm  likewise for SIGTERM, exit 20 + the number seen
 *   fork     leak 3 x 1000 bytes in leak_in_main, fork: the child keeps 5 x 700 bytes in
 *            leak_in_child at once and exits 0; the parent waits for it and exits 0
 *   exec     fork; the child execs this program again with "exec-child"; wait for it, exit 0
 *   exec-child  keep 6 x 600 bytes in leak_after_exec, exit 0
 *   vfork, spawn, system, popen, execl, execlp, execle  start this program with "exec-child"
 *            that way (vfork and execv; posix_spawn; system(); popen() and read it to its end;
 *            fork and the execl call named), wait, exit 0
 *   env NAME print "NAME=value" (getenv) and "environ" if environ is set, exit 0
 *   cout     write a line through std::cout and printf, keep nothing of its own, exit 0 (what
 *            is left is the runtime's: libstdc++'s emergency pool, stdout's buffer)
 *   load-and-end LIB  dlopen LIB, call its loaded_last (5 x 77 bytes kept), return 0 at once */
#include <dlfcn.h>

#include <csignal>
#include <iostream>
#include <string>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctype.h>
#include <spawn.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

extern "C" void* lib_ctor_block;

#ifdef EMBED_SUPPRESSIONS  /* the program's own list, as LSan and heaptrack read it */
extern "C" const char* __lsan_default_suppressions() {
  return "# known: the static initializer's block\nleak:StaticInit\n";
}
#endif

struct StaticInit {
  void* block;
  NOINLINE StaticInit() { block = memset(malloc(2222), 2, 2222); }
};
static StaticInit static_init;

static void* kept[64];
static int nkept;
static volatile sig_atomic_t signals_seen;

NOINLINE static void leak_in_main(void) {
  for (int i = 0; i < 3; i++) kept[nkept++] = memset(malloc(1000), 3, 1000);
}

NOINLINE static void keep_line(const char* line) {
  size_t n = strlen(line) + 1;
  char* copy = static_cast<char*>(malloc(n));
  memcpy(copy, line, n);
  kept[nkept++] = copy;
}

NOINLINE static void leak_in_child(void) {
  for (int i = 0; i < 5; i++) kept[nkept++] = memset(malloc(700), 5, 700);
}

NOINLINE static void leak_after_exec(void) {
  for (int i = 0; i < 6; i++) kept[nkept++] = memset(malloc(600), 6, 600);
}

NOINLINE static void keep_after_signal(void) { kept[nkept++] = memset(malloc(4321), 4, 4321); }

static void count_signal(int) { signals_seen = signals_seen + 1; }

static int wait_for_signal(int sig, int base) {
  signal(sig, count_signal);
  printf("ready\n");
  fflush(stdout);
  while (!signals_seen) pause();
  struct timespec half = {0, 500000000};
  while (nanosleep(&half, &half) != 0) {}
  keep_after_signal();
  return base + signals_seen;
}

/* Zeros over the stack below this frame, where leak_in_main's frames were: a conservative
 * scan (memhook's, valgrind's, LeakSanitizer's) takes a stale copy of a block's address in a
 * frame that later calls leave uninitialized for a pointer. */
NOINLINE static void scrub_stack(void) {
  volatile char area[32768];
  memset((char*)area, 0, sizeof area);
}

int main(int argc, char** argv) {
  if (!lib_ctor_block || !static_init.block || argc < 2) return 99;
  const char* mode = argv[1];
  if (!strcmp(mode, "load-and-end") && argc > 2) {  /* a library loaded and used, then the end */
    void* lib = dlopen(argv[2], RTLD_NOW);
    if (!lib) return 98;
    ((void (*)(void))dlsym(lib, "loaded_last"))();
    return 0;
  }
  if (!strcmp(mode, "exit") && argc > 2) {
    leak_in_main();
    exit(atoi(argv[2]));
  }
  if (!strcmp(mode, "lose")) {  /* main's 3 x 1000, their addresses dropped: lost at exit */
    leak_in_main();
    memset(kept, 0, sizeof kept);
    scrub_stack();  /* (exit()'s frames would otherwise find the last address in stale slots) */
    return 0;
  }
  if (!strcmp(mode, "segv")) {
    leak_in_main();
    fflush(stdout);
    raise(SIGSEGV);
  }
  if (!strcmp(mode, "stdin")) {
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
      line[strcspn(line, "\n")] = 0;
      keep_line(line);
      for (char* c = line; *c; c++) *c = toupper(*c);
      printf("%s\n", line);
    }
    return 0;
  }
  if (!strcmp(mode, "sigint")) return wait_for_signal(SIGINT, 10);
  if (!strcmp(mode, "sigterm")) return wait_for_signal(SIGTERM, 20);
  if (!strcmp(mode, "fork")) {
    leak_in_main();
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
      leak_in_child();
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 97;
  }
  if (!strcmp(mode, "exec")) {
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
      char* const again[] = {argv[0], (char*)"exec-child", nullptr};
      execv(argv[0], again);
      _exit(96);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 97;
  }
  char* const again[] = {argv[0], (char*)"exec-child", nullptr};
  std::string command = std::string("'") + argv[0] + "' exec-child";
  if (!strcmp(mode, "vfork")) {
    pid_t child = vfork();
    if (child == 0) {
      execv(argv[0], again);
      _exit(96);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 97;
  }
  if (!strcmp(mode, "spawn")) {
    pid_t child = 0;
    if (posix_spawn(&child, argv[0], nullptr, nullptr, again, environ) != 0) return 95;
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 97;
  }
  if (!strncmp(mode, "execl", 5)) {
    pid_t child = fork();
    if (child == 0) {
      if (!strcmp(mode, "execl")) execl(argv[0], argv[0], "exec-child", (char*)nullptr);
      if (!strcmp(mode, "execlp")) execlp(argv[0], argv[0], "exec-child", (char*)nullptr);
      if (!strcmp(mode, "execle")) execle(argv[0], argv[0], "exec-child", (char*)nullptr, environ);
      _exit(96);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 97;
  }
  if (!strcmp(mode, "system")) return system(command.c_str()) == 0 ? 0 : 97;
  if (!strcmp(mode, "popen")) {
    FILE* f = popen(command.c_str(), "r");
    if (!f) return 95;
    char buf[256];
    while (fgets(buf, sizeof buf, f)) fputs(buf, stdout);
    return pclose(f) == 0 ? 0 : 97;
  }
  if (!strcmp(mode, "env") && argc > 2) {
    const char* v = getenv(argv[2]);
    printf("%s=%s\n%s\n", argv[2], v ? v : "(unset)", environ ? "environ" : "no environ");
    return 0;
  }
  if (!strcmp(mode, "exec-child")) {
    leak_after_exec();
    return 0;
  }
  if (!strcmp(mode, "cout")) {
    std::cout << "through std::cout" << std::endl;
    printf("through printf\n");
    return 0;
  }
  return 98;
}
