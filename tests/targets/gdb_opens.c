/* Preloaded into GDB by tests (not a target): one line per file GDB opened and per ptrace
 * attach or detach, in the order they happened, with GDB's PID:
 *   "PID open PATH", "PID attach", "PID detach"
 * and before each attach, GDB's scheduling group as /proc/self/autogroup tells it:
 *   "PID autogroup /autogroup-123 nice -10"
 * appended to $GDB_OPENS_LOG. Files are logged only when the open succeeded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <unistd.h>

static void note(const char* what, const char* path) {
  static int fd = -2;
  if (fd == -2) {
    const char* log = getenv("GDB_OPENS_LOG");
    int (*real_open)(const char*, int, ...) = dlsym(RTLD_NEXT, "open");
    fd = log ? real_open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600) : -1;
  }
  char line[4200];
  int n = snprintf(line, sizeof line, "%d %s %s\n", (int)getpid(), what, path ? path : "");
  if (fd >= 0 && n > 0 && n < (int)sizeof line) write(fd, line, n);
}

static int mode_of(int flags, va_list ap) {
  return (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, int) : 0;
}

#define OPEN(name)                                                                     \
  int name(const char* path, int flags, ...) {                                         \
    va_list ap;                                                                        \
    va_start(ap, flags);                                                               \
    int mode = mode_of(flags, ap);                                                     \
    va_end(ap);                                                                        \
    int (*real)(const char*, int, ...) = dlsym(RTLD_NEXT, #name);                      \
    int fd = real(path, flags, mode);                                                  \
    if (fd >= 0) note("open", path);                                                   \
    return fd;                                                                         \
  }
#define OPENAT(name)                                                                   \
  int name(int dir, const char* path, int flags, ...) {                                \
    va_list ap;                                                                        \
    va_start(ap, flags);                                                               \
    int mode = mode_of(flags, ap);                                                     \
    va_end(ap);                                                                        \
    int (*real)(int, const char*, int, ...) = dlsym(RTLD_NEXT, #name);                 \
    int fd = real(dir, path, flags, mode);                                             \
    if (fd >= 0) note("open", path);                                                   \
    return fd;                                                                         \
  }
#define FOPEN(name)                                                                    \
  FILE* name(const char* path, const char* mode) {                                     \
    FILE* (*real)(const char*, const char*) = dlsym(RTLD_NEXT, #name);                 \
    FILE* f = real(path, mode);                                                        \
    if (f) note("open", path);                                                         \
    return f;                                                                          \
  }
OPEN(open)
OPEN(open64)
OPENAT(openat)
OPENAT(openat64)
FOPEN(fopen)
FOPEN(fopen64)

long ptrace(enum __ptrace_request req, ...) {
  va_list ap;
  va_start(ap, req);
  pid_t pid = va_arg(ap, pid_t);
  void* addr = va_arg(ap, void*);
  void* data = va_arg(ap, void*);
  va_end(ap);
  if (req == PTRACE_ATTACH || req == PTRACE_SEIZE) {
    char group[128] = "";
    int (*real_open)(const char*, int, ...) = dlsym(RTLD_NEXT, "open");
    int fd = real_open("/proc/self/autogroup", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, group, sizeof group - 1) : -1;
    if (fd >= 0) close(fd);
    group[n > 0 ? n : 0] = 0;
    for (char* c = group; *c; c++)
      if (*c == '\n') *c = 0;
    note("autogroup", group);
    note("attach", "");
  }
  if (req == PTRACE_DETACH) note("detach", "");
  long (*real)(int, pid_t, void*, void*) = dlsym(RTLD_NEXT, "ptrace");
  return real(req, pid, addr, data);
}
