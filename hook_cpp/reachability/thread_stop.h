// Every thread of the target held still for the leak check, and its registers: PTRACE_SEIZE and
// PTRACE_INTERRUPT, no signal sent (a SIGSTOP left pending after a failure would stop the
// target for good; an interrupt is forgotten when the tracer goes). The caller must be a thread
// that ends when the check does: ptrace belongs to the thread that seized, and a tracer thread's
// exit detaches its tracees, however it ends (memhook killed with -9 included).
#pragma once
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "arch.h"
#include "clock.h"

namespace memhook::reachability {

// A thread's general registers (NT_PRSTATUS), as PTRACE_GETREGSET gives them and
// PTRACE_SETREGSET takes them (which takes no more than it gives), and the thread pointer at
// arch::kRegsThreadPointer where it has a regset of its own (AArch64's TPIDR_EL0).
inline bool get_regs(int tid, std::vector<uint64_t>* regs) {
  regs->assign(64, 0);
  struct iovec io = {regs->data(), regs->size() * 8};
  if (ptrace(PTRACE_GETREGSET, tid, (void*)(uintptr_t)NT_PRSTATUS, &io) != 0) return false;
  regs->resize(io.iov_len / 8);
  if (arch::kThreadPointerRegset) {
    uint64_t tp = 0;
    struct iovec tio = {&tp, 8};
    if (ptrace(PTRACE_GETREGSET, tid, (void*)(uintptr_t)arch::kThreadPointerRegset, &tio) != 0)
      tp = 0;
    regs->resize(std::max<size_t>(regs->size(), arch::kRegsThreadPointer + 1));
    (*regs)[arch::kRegsThreadPointer] = tp;
  }
  return true;
}
inline bool set_regs(int tid, const std::vector<uint64_t>& regs) {
  struct iovec io = {const_cast<uint64_t*>(regs.data()), regs.size() * 8};
  return ptrace(PTRACE_SETREGSET, tid, (void*)(uintptr_t)NT_PRSTATUS, &io) == 0;
}

struct StoppedThread {
  int tid;
  int signal = 0;  // a signal the thread stopped to take: given back at detach
  std::vector<int> more_signals;  // signals that came while it made a call for memhook
  std::vector<uint64_t> regs;     // (forked_image.h): sent again after detach
  bool in_call = false;  // stopped at the end of that call: no signal can be handed at detach
  uint64_t sp() const {
    return regs.size() > arch::kRegsStackPointer ? regs[arch::kRegsStackPointer] : 0;
  }
};

class StoppedThreads {
 public:
  ~StoppedThreads() { resume(); }

  // Seize and stop every thread of `pid`, then read their registers. False (with `why`) if a
  // thread cannot be seized (another tracer) or does not stop by `deadline_ns`; the threads
  // stopped so far are let go by resume() or by this thread's exit.
  bool stop(int pid, uint64_t deadline_ns, std::string* why) {
    pid_ = pid;
    for (;;) {
      std::vector<int> fresh;
      for (int tid : tids(pid))
        if (!seized_.count(tid)) fresh.push_back(tid);
      if (fresh.empty()) break;  // every thread listed is stopped: none can start another
      for (int tid : fresh) {
        if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
          if (errno == ESRCH) continue;  // it exited
          *why = "cannot stop thread " + std::to_string(tid) + " (" + strerror(errno) +
                 (errno == EPERM ? ": traced by another process?" : "") + ")";
          return false;
        }
        seized_.insert(tid);
        ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
      }
      for (int tid : fresh)
        if (seized_.count(tid) && !held(tid, deadline_ns, why)) return false;
    }
    return true;
  }

  // One thread of `pid` stopped (the first that can be), for a call it is made to make.
  bool stop_one(int pid, uint64_t deadline_ns, std::string* why) {
    pid_ = pid;
    for (int tid : tids(pid)) {
      if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) continue;
      seized_.insert(tid);
      ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
      if (held(tid, deadline_ns, why) && !threads_.empty()) return true;
    }
    if (why->empty()) *why = "no thread of PID " + std::to_string(pid) + " could be stopped";
    return false;
  }

  const std::vector<StoppedThread>& threads() const { return threads_; }
  std::vector<StoppedThread>& mutable_threads() { return threads_; }

  // Let every stopped thread go (a signal it stopped for delivered as it would have been, and
  // those that came while it made a call for memhook sent again).
  void resume() {
    for (StoppedThread& t : threads_) {
      std::vector<int> later = t.more_signals;
      int now = t.signal;
      if (t.in_call) {  // (at a system call's stop a signal cannot be handed over: sent)
        if (now) later.insert(later.begin(), now);
        now = 0;
      } else if (!now && !later.empty()) {
        now = later.front();
        later.erase(later.begin());
      }
      ptrace(PTRACE_DETACH, t.tid, nullptr, (void*)(uintptr_t)now);
      for (int sig : later) syscall(SYS_tgkill, pid_, t.tid, sig);
    }
    threads_.clear();
    seized_.clear();
  }

 private:
  static std::vector<int> tids(int pid) {
    std::vector<int> out;
    const std::string dir = "/proc/" + std::to_string(pid) + "/task";
    if (DIR* d = opendir(dir.c_str())) {
      while (struct dirent* e = readdir(d))
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9') out.push_back(atoi(e->d_name));
      closedir(d);
    }
    return out;
  }

  // Seized thread `tid` stopped by `deadline_ns`, its registers read: false (with `why`) if
  // it did not stop in time or its registers cannot be read; true if it stopped, or exited.
  bool held(int tid, uint64_t deadline_ns, std::string* why) {
    int st = 0;
    for (;;) {
      const pid_t r = waitpid(tid, &st, __WALL | WNOHANG);
      if (r == tid) break;
      if (r < 0 || monotonic_ns() > deadline_ns) {
        *why = r < 0 ? "lost thread " + std::to_string(tid)
                     : "thread " + std::to_string(tid) + " did not stop in time (state D?)";
        return false;
      }
      struct timespec ts = {0, 20000};
      nanosleep(&ts, nullptr);
    }
    if (WIFEXITED(st) || WIFSIGNALED(st)) {
      seized_.erase(tid);
      return true;
    }
    StoppedThread t{tid};
    // A stop to take a signal (a seized thread's interrupt and group stops carry an event in
    // the high bits): the signal is given back at detach, a SIGTRAP too.
    if (WIFSTOPPED(st) && (st >> 16) == 0) t.signal = WSTOPSIG(st);
    if (!get_regs(tid, &t.regs)) {
      *why = "cannot read the registers of thread " + std::to_string(tid);
      threads_.push_back(t);
      return false;
    }
    threads_.push_back(std::move(t));
    return true;
  }

  int pid_ = 0;
  std::set<int> seized_;
  std::vector<StoppedThread> threads_;
};

}  // namespace memhook::reachability
