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
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "arch.h"
#include "clock.h"

namespace memhook::reachability {

struct StoppedThread {
  int tid;
  int signal = 0;  // a signal the thread stopped to take: given back at detach
  std::vector<uint64_t> regs;
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
      for (int tid : fresh) {
        if (!seized_.count(tid)) continue;
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
          continue;
        }
        StoppedThread t{tid};
        // A stop to take a signal (a seized thread's interrupt and group stops carry an event
        // in the high bits): the signal is given back at detach, a SIGTRAP too.
        if (WIFSTOPPED(st) && (st >> 16) == 0) t.signal = WSTOPSIG(st);
        t.regs.assign(64, 0);
        struct iovec io = {t.regs.data(), t.regs.size() * 8};
        if (ptrace(PTRACE_GETREGSET, tid, (void*)(uintptr_t)NT_PRSTATUS, &io) != 0) {
          *why = "cannot read the registers of thread " + std::to_string(tid);
          threads_.push_back(t);
          return false;
        }
        t.regs.resize(io.iov_len / 8);
        threads_.push_back(std::move(t));
      }
    }
    return true;
  }

  const std::vector<StoppedThread>& threads() const { return threads_; }

  // Let every stopped thread go (a signal it stopped for delivered as it would have been).
  void resume() {
    for (const StoppedThread& t : threads_)
      ptrace(PTRACE_DETACH, t.tid, nullptr, (void*)(uintptr_t)t.signal);
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

  std::set<int> seized_;
  std::vector<StoppedThread> threads_;
};

}  // namespace memhook::reachability
