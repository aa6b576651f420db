// The leak check of a running process: every thread stopped (thread_stop.h), the blocks live at
// that moment taken (the caller's: the consumer drained, the census's blocks still held), the
// roots read (roots.h) and every block reached marked (leak_marking.h), then the threads let go.
// The target's memory is read from outside, /proc/PID/mem and process_vm_readv, never written;
// pages the target never touched are skipped (pagemap), unreadable ones counted.
#pragma once
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "leak_marking.h"
#include "roots.h"
#include "target_memory.h"
#include "thread_stop.h"

namespace memhook::reachability {

struct LeakCheck {
  std::string skipped;  // why no answer (then nothing below counts)
  std::vector<Block> blocks;  // each with its state
  RootRanges roots;
  uint32_t threads = 0;
  uint64_t pause_ns = 0, scan_ns = 0, bytes_read = 0, unreadable_bytes = 0;
};

class BlockReader {
 public:
  BlockReader(int pid, int mem_fd, int pagemap_fd) : pid_(pid), mem_(mem_fd), pagemap_(pagemap_fd) {}

  // Every touched page of [lo, hi), in pieces: fn(words, n) for each aligned run of words.
  template <class Fn>
  void range(uint64_t lo, uint64_t hi, Fn fn) {
    lo = (lo + 7) & ~uint64_t(7);
    hi &= ~uint64_t(7);
    if (hi <= lo) return;
    census::ResidentPages pages(pagemap_, lo, hi);
    buf_.resize(kPiece / 8);
    for (uint64_t at = lo; at < hi;) {
      if (pages.known() && !pages.in_memory_or_swap(at)) {  // never touched: no pointers
        at = std::min(hi, (at & ~(census::kPage - 1)) + census::kPage);
        continue;
      }
      uint64_t end = std::min(hi, at + kPiece);
      if (pages.known()) end = std::min(end, pages.touched_until(at, end));
      const size_t got = mem_.read_some(at, buf_.data(), size_t(end - at));
      bytes_ += got;
      if (got / 8) fn(buf_.data(), got / 8);
      if (got < end - at) {  // an unreadable page: skip it
        const uint64_t bad = (at + got) & ~(census::kPage - 1);
        const uint64_t next = std::min(hi, bad + census::kPage);
        unreadable_ += next - (at + got);
        at = next;
      } else {
        at = end;
      }
    }
  }

  // Blocks in one process_vm_readv where they fit, big ones page by page as range() reads.
  template <class Fn>
  void blocks(const std::vector<Block>& all, const std::vector<uint32_t>& which, Fn fn) {
    std::vector<struct iovec> remote;
    std::vector<uint32_t> in_call;
    size_t total = 0;
    buf_.resize(kPiece / 8);
    auto flush = [&] {
      if (remote.empty()) return;
      struct iovec local = {buf_.data(), total};
      ssize_t got = process_vm_readv(pid_, &local, 1, remote.data(), remote.size(), 0);
      size_t off = 0;
      for (size_t i = 0; i < remote.size(); i++) {
        const size_t n = remote[i].iov_len;
        if (got >= 0 && off + n <= size_t(got)) {
          bytes_ += n;
          fn(in_call[i], buf_.data() + off / 8, n / 8);
        } else {  // not read whole in that call: on its own (a page may be unreadable)
          const Block& b = all[in_call[i]];
          std::vector<uint64_t> one(n / 8);
          const size_t r = mem_.read_some(b.addr, one.data(), n);
          bytes_ += r;
          unreadable_ += n - r;
          fn(in_call[i], one.data(), r / 8);
        }
        off += n;
      }
      remote.clear();
      in_call.clear();
      total = 0;
    };
    for (uint32_t k : which) {
      const Block& b = all[k];
      const uint64_t lo = (b.addr + 7) & ~uint64_t(7), hi = (b.addr + b.size) & ~uint64_t(7);
      if (hi <= lo) continue;
      const size_t n = size_t(hi - lo);
      if (n > kBigBlock) {
        range(lo, hi, [&](const uint64_t* w, size_t m) { fn(k, w, m); });
        continue;
      }
      if (total + n > kPiece || remote.size() == kMaxIov) flush();
      remote.push_back({(void*)lo, n});
      in_call.push_back(k);
      total += n;
    }
    flush();
  }

  uint64_t bytes() const { return bytes_; }
  uint64_t unreadable() const { return unreadable_; }

 private:
  static constexpr size_t kPiece = size_t(1) << 20;  // bytes per read
  static constexpr size_t kBigBlock = size_t(256) << 10;  // read by pages touched
  static constexpr size_t kMaxIov = 1024;                 // IOV_MAX
  int pid_;
  census::TargetMemory mem_;
  int pagemap_;
  std::vector<uint64_t> buf_;
  uint64_t bytes_ = 0, unreadable_ = 0;
};

// `take_blocks` runs with every thread stopped and returns the blocks live at that moment.
// On its own thread, which ends with the check: see thread_stop.h.
inline LeakCheck check_leaks(int pid, const std::vector<Range>& exclude, bool heaps_known,
                             uint64_t max_pause_ns,
                             const std::function<std::vector<Block>()>& take_blocks) {
  LeakCheck out;
  std::thread worker([&] {
    const std::string proc = "/proc/" + std::to_string(pid);
    const int mem = open((proc + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
    const int pagemap = open((proc + "/pagemap").c_str(), O_RDONLY | O_CLOEXEC);
    const uint64_t t0 = now_ns(), deadline = t0 + max_pause_ns;
    {
      StoppedThreads stopped;
      if (mem < 0) {
        out.skipped = "cannot read the target's memory";
      } else if (stopped.stop(pid, deadline, &out.skipped)) {
        out.threads = uint32_t(stopped.threads().size());
        Marking marking(take_blocks());
        out.roots = root_ranges(pid, marking.blocks(), stopped.threads(), exclude, heaps_known);
        BlockReader reader(pid, mem, pagemap);
        auto more = [&] { return now_ns() < deadline; };
        for (const StoppedThread& t : stopped.threads())
          marking.scan(t.regs.data(), t.regs.size(), true);
        bool done = true;
        for (const Range& r : out.roots.ranges) {
          reader.range(r.lo, r.hi, [&](const uint64_t* w, size_t n) { marking.scan(w, n, true); });
          if (!(done = marking.run([&](const auto& which, auto fn) {
                  reader.blocks(marking.blocks(), which, fn);
                }, more)))
            break;
        }
        if (done)
          done = marking.cliques([&](const auto& which, auto fn) {
            reader.blocks(marking.blocks(), which, fn);
          }, more);
        out.bytes_read = reader.bytes();
        out.unreadable_bytes = reader.unreadable();
        if (!done)
          out.skipped = "the check would have paused the target longer than --max-pause (" +
                        std::to_string(max_pause_ns / 1000000) + " ms)";
        else
          out.blocks = std::move(marking.blocks());
      }
      stopped.resume();
      out.pause_ns = now_ns() - t0;
    }
    if (mem >= 0) close(mem);
    if (pagemap >= 0) close(pagemap);
  });
  worker.join();
  return out;
}

}  // namespace memhook::reachability
