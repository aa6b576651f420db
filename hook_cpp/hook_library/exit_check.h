// The leak check at exit: a program that ends with exit() (or by returning from main) waits in
// this library's destructor, which exit() runs after the program's atexit handlers and static
// destructors, until memhook has checked which of its blocks are still reachable (the threads
// stopped, its memory read: reachability/). As valgrind and LeakSanitizer check at exit. A
// program killed, or ending with _exit, runs no destructor: memhook says so. The wait is
// short: memhook looks every 50 ms, and once its check holds the threads, time spent there
// does not matter; a memhook that does not come lets the program end.
// Without the check the program waits so only when it loaded libraries memhook has not read
// yet: their names would be gone with the process (a Python program's last imports, just
// before it ends, were addresses in no module in every report).
#pragma once

namespace {

constexpr uint64_t kExitWaitNs = 5ull * 1000000000u;

__attribute__((destructor)) void exit_check() {
  Control* c = g_ctl;
  if (!active() || !c) return;
  const uint32_t loads = __atomic_load_n(&c->loads, __ATOMIC_ACQUIRE);
  if (!__atomic_load_n(&c->check_at_exit, __ATOMIC_ACQUIRE) &&
      loads == __atomic_load_n(&c->loads_read, __ATOMIC_ACQUIRE))
    return;
  __atomic_store_n(&c->exit_state, (uint32_t)kExitAnnounced, __ATOMIC_RELEASE);
  wait_for_memhook(c, kExitWaitNs, [&] {
    return __atomic_load_n(&c->exit_state, __ATOMIC_ACQUIRE) == kExitDone;
  });
}

}  // namespace
