// A copy-on-write image of the target for the leak check to read while the target runs on. With
// every thread stopped (thread_stop.h), one of them is made to call clone() without CLONE_VM at
// the hook library's stub (arch/*/syscall_stub.S); memhook traces the copy from its first
// instruction (PTRACE_O_TRACECLONE), so it never runs. Then the threads are let go: the pause is
// the clone's (the page tables copied), not the scan's. After the scan the copy is killed. Its
// exit signal is none (the target is told nothing, and its wait(-1) never sees it), and the
// target reaps it: one of its threads, stopped again for a moment, is made to call wait4() on
// it. If memhook dies first, the copy dies with it (PTRACE_O_EXITKILL, set on the copy alone)
// and stays a zombie of the target's, which its wait(-1) never sees, until the target ends.
#pragma once
#include <errno.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <string>
#include <vector>

#include "arch.h"
#include "segment.h"
#include "thread_stop.h"

namespace memhook::reachability {

// How long a call waits for the last call's thread to take its registers.
constexpr uint64_t kCallAreaWaitNs = 2000000000ull;

// The last call's thread has taken its registers from Control::call_regs (it may not have run
// since it was let go), by kCallAreaWaitNs.
inline bool call_area_free(Control* ctl) {
  const uint64_t until = monotonic_ns() + kCallAreaWaitNs;
  while (__atomic_load_n(&ctl->call_state, __ATOMIC_ACQUIRE) == kCallArmed) {
    if (monotonic_ns() > until) return false;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, nullptr);
  }
  return true;
}

// The writable mappings of `pid`, [lo, hi), read once for every thread a call may be asked of.
inline std::vector<std::pair<uint64_t, uint64_t>> writable_mappings(int pid) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  FILE* f = fopen(("/proc/" + std::to_string(pid) + "/maps").c_str(), "re");
  if (!f) return out;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8] = {0};
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[0] == 'r' && perms[1] == 'w')
      out.emplace_back(lo, hi);
  }
  fclose(f);
  return out;
}

// Room below `sp` in one writable mapping for what the stub keeps there (arch.h: x86-64's return
// under the red zone, AArch64's signal frame). A thread at the very end of its stack is not
// made to make a call.
inline bool room_below(const std::vector<std::pair<uint64_t, uint64_t>>& writable, uint64_t sp) {
  for (auto& [lo, hi] : writable)
    if (lo + arch::kStubStackBytes <= sp && sp <= hi) return true;
  return false;
}

// One system call made by stopped thread `t` at `stub`: the registers it must have after the
// call go into Control::call_regs (`ctl`: the segment memhook shares with the target) first,
// for the stub to put back by itself; then its registers are set for the call, and it is let go
// from system call stop to system call stop (PTRACE_SYSCALL), a clone's event between
// (`child`: the process the call clones, traced from its start; null for another call). True
// with *result once it stopped at the call's end; it stays there until resume() (the stub then
// returns it to where it was). Signals that arrive meanwhile are kept for after. Killed at any
// moment, memhook leaves the thread to finish the stub and go on as it would have.
inline bool injected_syscall(StoppedThread& t, uint64_t stub, Control* ctl, long nr,
                             std::initializer_list<uint64_t> args, long* result, int* child) {
  // The last call's thread must have taken its registers first (it may not have run since).
  if (!call_area_free(ctl)) return false;
  std::vector<uint64_t> after = t.regs;
  arch::as_resumed(after.data());
  for (size_t i = 0; i < after.size() && i < size_t(kCallRegs); i++)
    __atomic_store_n(&ctl->call_regs[i], after[i], __ATOMIC_RELAXED);
  __atomic_store_n(&ctl->call_result, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&ctl->call_kind, child ? kCallClone : kCallWait, __ATOMIC_RELAXED);
  __atomic_store_n(&ctl->call_state, kCallArmed, __ATOMIC_SEQ_CST);
  std::vector<uint64_t> r = t.regs;
  r[arch::kRegsProgramCounter] = stub;
  r[arch::kRegsSyscallNumber] = uint64_t(nr);
  arch::no_restart(r.data());
  int i = 0;
  for (uint64_t a : args) r[arch::kRegsSyscallArgs[i++]] = a;
  const long options = PTRACE_O_TRACESYSGOOD | (child ? PTRACE_O_TRACECLONE : 0);
  if (ptrace(PTRACE_SETOPTIONS, t.tid, nullptr, (void*)options) != 0 || !set_regs(t.tid, r)) {
    ptrace(PTRACE_SETOPTIONS, t.tid, nullptr, nullptr);
    __atomic_store_n(&ctl->call_state, kCallFree, __ATOMIC_SEQ_CST);  // (it never went)
    return false;
  }
  t.in_call = true;  // (from here on its stop is no signal's)
  bool entered = false;
  ptrace(PTRACE_SYSCALL, t.tid, nullptr, nullptr);
  for (;;) {
    int st = 0;
    if (waitpid(t.tid, &st, __WALL) != t.tid || WIFEXITED(st) || WIFSIGNALED(st))
      return false;  // (the thread is gone)
    const int event = st >> 16;
    if (WSTOPSIG(st) == (SIGTRAP | 0x80)) {
      if (entered) {
        std::vector<uint64_t> now;
        *result = get_regs(t.tid, &now) ? long(now[arch::kRegsSyscallResult]) : -EIO;
        break;
      }
      entered = true;
    } else if (event == PTRACE_EVENT_CLONE && child) {
      unsigned long pid = 0;
      ptrace(PTRACE_GETEVENTMSG, t.tid, nullptr, &pid);
      *child = int(pid);
    } else if (event == 0) {
      t.more_signals.push_back(WSTOPSIG(st));  // a signal that came meanwhile: sent again
    }
    ptrace(PTRACE_SYSCALL, t.tid, nullptr, nullptr);  // (and past a group stop, another event)
  }
  ptrace(PTRACE_SETOPTIONS, t.tid, nullptr, nullptr);
  return true;
}

class ForkedImage {
 public:
  ~ForkedImage() { kill_copy(); }

  // The copy, made by one of `threads` of `pid` (every one stopped). False with `why`: the thread
  // could not make the call, or clone() failed (no memory to commit, the process limit).
  bool take(int pid, std::vector<StoppedThread>& threads, uint64_t stub, Control* ctl,
            std::string* why) {
    if (threads.empty() || !stub) {
      *why = "no thread to make the copy";
      return false;
    }
    const auto writable = writable_mappings(pid);
    size_t k = 0;
    while (k < threads.size() && (!room_below(writable, threads[k].sp()) ||
                                  arch::restarts_from_scratch(threads[k].regs.data())))
      k++;
    if (k == threads.size()) {
      *why = "no thread has room on its stack for the call, or may be made to";
      return false;
    }
    long r = 0;
    int child = 0;
    bool called = false;
    // A signal that came during clone() stops it before it made anything (the kernel's
    // ERESTARTNOINTR, 513, which a traced call sees where a program's would be restarted): it
    // is made again, a few times (a target flooded with SIGPIPE under attach saw it each time).
    constexpr long kRestart = 513;
    for (int attempt = 0; attempt < 8; attempt++) {
      called = injected_syscall(threads[k], stub, ctl, SYS_clone, {CLONE_FILES, 0, 0, 0, 0}, &r,
                                &child);
      if (!called || child > 0 || (r != -kRestart && r != -EINTR)) break;
    }
    if (child > 0) {
      pid_ = child;
      __atomic_store_n(&ctl->check_copy, child, __ATOMIC_RELEASE);  // (reaped by the library
                                                                     // if memhook dies first)
      int st = 0;  // its first stop, before any instruction of its own
      if (waitpid(pid_, &st, __WALL) == pid_ && WIFSTOPPED(st))
        ptrace(PTRACE_SETOPTIONS, pid_, nullptr, (void*)PTRACE_O_EXITKILL);
    }
    if (!called || r <= 0 || !pid_) {
      *why = "clone() in the target failed (" +
             std::string(r < 0 ? strerror(int(-r)) : "the thread could not make the call") + ")";
      return false;
    }
    return true;
  }

  int pid() const { return pid_; }

  // After the scan: the copy killed, and reaped by the target (one thread of `target` stopped for
  // the wait4() call). False if the target could not be made to reap it (then it stays a zombie
  // its wait(-1) never sees).
  // *paused_ns: how long that thread was held.
  bool release(int target, uint64_t stub, Control* ctl, uint64_t deadline_ns,
               uint64_t* paused_ns) {
    if (!pid_) return true;
    const int copy = pid_;
    kill_copy();
    if (!call_area_free(ctl)) return false;  // (before a thread is held: it may be that one)
    const uint64_t t0 = monotonic_ns();
    StoppedThreads one;
    std::string why;
    if (!one.stop_one(target, deadline_ns, &why) ||
        !room_below(writable_mappings(target), one.threads()[0].sp()) ||
        arch::restarts_from_scratch(one.threads()[0].regs.data()))
      return false;
    long r = 0;
    const bool ok = injected_syscall(one.mutable_threads()[0], stub, ctl, SYS_wait4,
                                     {uint64_t(copy), 0, __WALL, 0}, &r, nullptr);
    one.resume();
    *paused_ns = monotonic_ns() - t0;
    if (ok && r == copy) __atomic_store_n(&ctl->check_copy, 0, __ATOMIC_RELEASE);
    return ok && r == copy;
  }

 private:
  void kill_copy() {
    if (!pid_) return;
    kill(pid_, SIGKILL);
    int st = 0;
    while (waitpid(pid_, &st, __WALL) == pid_ && !WIFEXITED(st) && !WIFSIGNALED(st)) {
    }
    pid_ = 0;
  }

  int pid_ = 0;
};

}  // namespace memhook::reachability
