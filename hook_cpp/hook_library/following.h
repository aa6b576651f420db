// --follow-fork: a child forked with the hooks armed, and a program about to exec, each wait
// for memhook, so that the child's first allocation, and the new program's, are traced. The
// wait ends when memhook is done with them, when its heartbeat stops, or after kForkWaitNs.
#pragma once

#include <stdarg.h>

namespace {

// memhook's heartbeat is older than the session allows: memhook is gone.
bool consumer_gone(const Control* c, uint64_t now) {
  uint64_t beat = __atomic_load_n(&c->heartbeat_ns, __ATOMIC_RELAXED);
  return beat && now > beat + c->abandon_after_ns;
}

// Nap 1 ms at a time until done() holds (true), or memhook is gone or the wait too long (false).
template <class Done>
bool wait_for_memhook(const Control* c, uint64_t longest_ns, Done done) {
  const uint64_t until = monotonic_ns() + longest_ns;
  for (;;) {
    if (done()) return true;
    const uint64_t now = monotonic_ns();
    if (now > until || consumer_gone(c, now)) return false;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, nullptr);
  }
}

bool following(const Control* c) {
  return c && __atomic_load_n(&c->follow_forks, __ATOMIC_ACQUIRE);
}

// A forked child must not write into its parent's rings: its hooks pass through. Under
// --follow-fork it then announces itself in the parent's segment (still mapped here, shared)
// and waits for memhook to attach to it as to any process (this library already loaded: a new
// segment, memhook_start, the slots taken over), so that its first allocation after fork is
// traced. memhook clears the entry when done; or memhook_start ends the wait first: it maps
// the child's own segment over the parent's, where this entry reads 0.
void forked_child() {
  const bool armed = active();
  g_session.mode = kOff;
  Control* c = g_ctl;
  if (!armed || !following(c)) return;
  const uint32_t i = __atomic_fetch_add(&c->nforked, 1, __ATOMIC_ACQ_REL);
  if (i >= (uint32_t)kMaxForked) return;
  const int32_t self = (int32_t)syscall(SYS_getpid);
  __atomic_store_n(&c->forked[i], self, __ATOMIC_RELEASE);
  wait_for_memhook(c, kForkWaitNs,
                   [&] { return __atomic_load_n(&c->forked[i], __ATOMIC_ACQUIRE) != self; });
}

// An exec under --follow-fork: this thread announces itself and waits until memhook is its
// tracer (it then sees the exec, and holds the new program where its loader is done), then
// execs. An exec that fails says so and waits until memhook has let go of the thread.
// A program started in a child by libc itself (posix_spawn, system, popen) likewise: memhook
// traces this thread until the child exists, then lets go of it (exec_tid cleared) and
// follows the child. A call that fails before the child exists says so as an exec does.
template <class Exec>
auto exec_followed(Exec real_exec, ExecState announced = kExecAnnounced) {
  Control* c = g_ctl;
  int32_t self = 0;
  if (active() && following(c)) {
    const int32_t tid = (int32_t)syscall(SYS_gettid);
    int32_t none = 0;
    if (__atomic_compare_exchange_n(&c->exec_tid, &none, tid, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      __atomic_store_n(&c->exec_state, (uint32_t)announced, __ATOMIC_RELEASE);
      if (wait_for_memhook(c, kForkWaitNs, [&] {
            return __atomic_load_n(&c->exec_state, __ATOMIC_ACQUIRE) == kExecGo;
          })) {
        self = tid;
      } else {  // memhook did not come: exec untraced
        __atomic_store_n(&c->exec_state, (uint32_t)kExecNone, __ATOMIC_RELEASE);
        __atomic_store_n(&c->exec_tid, 0, __ATOMIC_RELEASE);
      }
    }
  }
  const auto rc = real_exec();
  if (self && __atomic_load_n(&c->exec_tid, __ATOMIC_ACQUIRE) == self) {
    const int saved = errno;
    __atomic_store_n(&c->exec_state, (uint32_t)kExecFailed, __ATOMIC_RELEASE);
    wait_for_memhook(c, kForkWaitNs,
                     [&] { return __atomic_load_n(&c->exec_tid, __ATOMIC_ACQUIRE) != self; });
    errno = saved;
  }
  return rc;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int memhook_hook_execve(
    const char* f, char* const* a, char* const* e) {
  return exec_followed([&] { return REAL(execve)(f, a, e); });
}
extern "C" __attribute__((visibility("default"))) int memhook_hook_execv(const char* f,
                                                                        char* const* a) {
  return exec_followed([&] { return REAL(execv)(f, a); });
}
extern "C" __attribute__((visibility("default"))) int memhook_hook_execvp(const char* f,
                                                                         char* const* a) {
  return exec_followed([&] { return REAL(execvp)(f, a); });
}
extern "C" __attribute__((visibility("default"))) int memhook_hook_execvpe(
    const char* f, char* const* a, char* const* e) {
  return exec_followed([&] { return REAL(execvpe)(f, a, e); });
}
extern "C" __attribute__((visibility("default"))) int memhook_hook_posix_spawn(
    pid_t* p, const char* f, const posix_spawn_file_actions_t* fa, const posix_spawnattr_t* at,
    char* const* a, char* const* e) {
  return exec_followed([&] { return REAL(posix_spawn)(p, f, fa, at, a, e); }, kSpawnAnnounced);
}
extern "C" __attribute__((visibility("default"))) int memhook_hook_posix_spawnp(
    pid_t* p, const char* f, const posix_spawn_file_actions_t* fa, const posix_spawnattr_t* at,
    char* const* a, char* const* e) {
  return exec_followed([&] { return REAL(posix_spawnp)(p, f, fa, at, a, e); }, kSpawnAnnounced);
}
extern "C" __attribute__((visibility("default"))) int memhook_hook_system(const char* c) {
  return exec_followed([&] { return REAL(system)(c); }, kSpawnAnnounced);
}
extern "C" __attribute__((visibility("default"))) FILE* memhook_hook_popen(const char* c,
                                                                          const char* m) {
  return exec_followed([&] { return REAL(popen)(c, m); }, kSpawnAnnounced);
}

// The execl family is variadic: its arguments become the argv of the exec it stands for, on
// this stack (as libc's own execl builds it), and the call is followed as that exec.
#define MEMHOOK_EXECL_ARGV(first, ap, argv)                                 \
  size_t argv##_n = 1;                                                       \
  {                                                                          \
    va_list count;                                                           \
    va_copy(count, ap);                                                      \
    while (va_arg(count, const char*)) argv##_n++;                           \
    va_end(count);                                                           \
  }                                                                          \
  char** argv = (char**)__builtin_alloca((argv##_n + 1) * sizeof(char*));    \
  argv[0] = (char*)(first);                                                  \
  for (size_t i = 1; i <= argv##_n; i++) argv[i] = va_arg(ap, char*);  // (and its NULL)

#define MEMHOOK_EXECL_HOOK(sym, exec)                                                   \
  extern "C" __attribute__((visibility("default"))) int memhook_hook_##sym(const char* f, \
                                                                          const char* a, ...) { \
    va_list ap;                                                                         \
    va_start(ap, a);                                                                    \
    MEMHOOK_EXECL_ARGV(a, ap, argv)                                                     \
    va_end(ap);                                                                         \
    return exec_followed([&] { return exec; });                                         \
  }
MEMHOOK_EXECL_HOOK(execl, REAL(execve)(f, argv, environ))
MEMHOOK_EXECL_HOOK(execlp, REAL(execvp)(f, argv))
extern "C" __attribute__((visibility("default"))) int memhook_hook_execle(const char* f,
                                                                         const char* a, ...) {
  va_list ap;
  va_start(ap, a);
  MEMHOOK_EXECL_ARGV(a, ap, argv)
  char* const* envp = va_arg(ap, char* const*);  // (after the arguments' NULL)
  va_end(ap);
  return exec_followed([&] { return REAL(execve)(f, argv, envp); });
}
