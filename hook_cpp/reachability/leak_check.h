// The leak check of a running process: every thread stopped (thread_stop.h), the blocks live at
// that moment taken (the caller's: the consumer drained, the census's blocks still held), the
// roots read (roots.h) and every block reached marked (leak_marking.h), then the threads let go.
// The target's memory is read from outside (/proc/PID/mem: see BlockReader::read_some), never
// written; pages the target never touched are skipped (pagemap), unreadable ones
// counted.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dynamic_tls.h"
#include "forked_image.h"
#include "interior_heuristics.h"
#include "leak_marking.h"
#include "roots.h"
#include "target_memory.h"
#include "thread_stop.h"

namespace memhook::reachability {

// A scan of the target's copy runs while the target does: bounded by time, not by the pause.
constexpr uint64_t kForkedScanLimitNs = 60000000000ull;
// How long a thread of the target may take to stop for the wait4() that reaps its copy.
constexpr uint64_t kReapWaitNs = 1000000000ull;

struct LeakCheck {
  std::string skipped;  // why no answer (then nothing below counts)
  bool forked = false;  // read from a copy-on-write image (forked_image.h), the target let go
  std::string fork_failed;  // why no copy was made, when one was asked for
  bool not_reaped = false;  // the copy could not be reaped by the target: a zombie of its
  std::vector<Block> blocks;  // each with its state
  RootRanges roots;
  uint32_t threads = 0;
  // The pause, and within it: stopping the threads, the consumer's catching up, the scan.
  uint64_t pause_ns = 0, stop_ns = 0, drain_ns = 0, fork_ns = 0, scan_ns = 0;
  uint64_t reap_ns = 0;  // after the scan: one thread held while it reaped its copy
  uint64_t bytes_read = 0, unreadable_bytes = 0;
};

class BlockReader {
 public:
  BlockReader(int mem_fd, int pagemap_fd) : mem_(mem_fd), pagemap_(pagemap_fd) {}

  // Every touched page of [lo, hi), in pieces of at most kPiece: fn(words, n) for each.
  template <class Fn>
  void range(uint64_t lo, uint64_t hi, Fn fn) {
    lo = (lo + 7) & ~uint64_t(7);
    hi &= ~uint64_t(7);
    buf_.resize(kPiece / 8);
    for (uint64_t at = lo; at < hi; at = std::min(hi, at + kPiece)) {
      const uint64_t end = std::min(hi, at + kPiece);
      if (read_into(at, end, buf_.data())) fn(buf_.data(), size_t(end - at) / 8);
    }
  }

  // Blocks, through a cache of the 1 MiB pieces of memory they lie in: a heap is read
  // piece by piece, near memcpy's speed, instead of one small read per block (1.7 us each for
  // 64-byte blocks). Pieces beyond the cache's budget are read
  // again when needed; blocks above a piece read by themselves.
  template <class Fn>
  void blocks(const std::vector<Block>& all, const std::vector<uint32_t>& which, Fn fn) {
    for (uint32_t k : which) {
      const Block& b = all[k];
      const uint64_t lo = (b.addr + 7) & ~uint64_t(7), hi = (b.addr + b.size) & ~uint64_t(7);
      if (hi <= lo) continue;
      if (hi - lo > kPiece) {
        range(lo, hi, [&](const uint64_t* w, size_t m) { fn(k, w, m); });
        continue;
      }
      const uint64_t p0 = lo / kPiece, p1 = (hi - 1) / kPiece;
      if (p0 == p1) {
        fn(k, piece(p0) + (lo - p0 * kPiece) / 8, size_t(hi - lo) / 8);
        continue;
      }
      // Across two pieces: copied together (the second read may evict nothing the first needs).
      const size_t first = size_t(p1 * kPiece - lo);
      span_.resize(size_t(hi - lo) / 8);
      std::memcpy(span_.data(), piece(p0) + (lo - p0 * kPiece) / 8, first);
      std::memcpy(span_.data() + first / 8, piece(p1), size_t(hi - lo) - first);
      fn(k, span_.data(), span_.size());
    }
  }

  uint64_t bytes() const { return bytes_; }
  uint64_t unreadable() const { return unreadable_; }

  // One aligned word: from a piece already read, else read alone (never a piece read here:
  // it could evict the one whose words are being scanned).
  bool word(uint64_t addr, uint64_t* out) {
    if (addr % 8) return false;
    auto it = pieces_.find(addr / kPiece);
    if (it != pieces_.end()) {
      *out = it->second.words[(addr % kPiece) / 8];
      return true;
    }
    return mem_.read(addr, out, 8);
  }

 private:
  // Piece i's words, read on first use (pages never touched and unreadable ones as zeros).
  // The least recently used piece goes when the budget is full: the marking walks a heap in
  // runs (a table's blocks one after another), so a piece is seldom wanted again once passed.
  const uint64_t* piece(uint64_t i) {
    auto it = pieces_.find(i);
    if (it != pieces_.end()) {
      it->second.used = ++tick_;
      return it->second.words.data();
    }
    if (pieces_.size() >= kCachedPieces) {
      auto oldest = pieces_.begin();
      for (auto j = pieces_.begin(); j != pieces_.end(); ++j)
        if (j->second.used < oldest->second.used) oldest = j;
      pieces_.erase(oldest);
    }
    Piece& p = pieces_[i];
    p.used = ++tick_;
    p.words.resize(kPiece / 8);
    read_into(i * kPiece, (i + 1) * kPiece, p.words.data());
    return p.words.data();
  }

  // [lo, hi) into `out` (its words at lo), read where the pages were touched, zeros where they
  // were not (no pointers there) or cannot be read. False if nothing was read.
  bool read_into(uint64_t lo, uint64_t hi, uint64_t* out) {
    census::ResidentPages pages(pagemap_, lo, hi);
    char* const base = reinterpret_cast<char*>(out) - lo;
    bool any = false;
    for (uint64_t at = lo; at < hi;) {
      uint64_t end = std::min(hi, (at & ~(census::kPage - 1)) + census::kPage);
      if (pages.known() && !pages.in_memory_or_swap(at)) {  // never touched
        std::memset(base + at, 0, end - at);
        at = end;
        continue;
      }
      if (pages.known()) end = std::max(end, pages.touched_until(at, hi));
      const size_t got = read_some(at, base + at, size_t(end - at));
      bytes_ += got;
      any = any || got;
      if (got < end - at) {  // an unreadable page: zeros, and on after it
        const uint64_t next = std::min(hi, ((at + got) & ~(census::kPage - 1)) + census::kPage);
        std::memset(base + at + got, 0, next - (at + got));
        unreadable_ += next - (at + got);
        at = next;
      } else {
        at = end;
      }
    }
    return any;
  }

  static constexpr size_t kPiece = size_t(1) << 20;  // bytes per read, and per cached piece
  static constexpr size_t kCachedPieces = 256;  // at most 256 MiB of the target's held
  struct Piece {
    std::vector<uint64_t> words;
    uint64_t used = 0;
  };
  // /proc/PID/mem, never process_vm_readv: that pins the pages it reads, and the kernel
  // unshares (copies) an anonymous page shared copy-on-write before it pins it, even to read.
  // Every page of the target's copy is such a page, and so is every page a target still shares
  // with a child it forked (a prefork server, redis saving): read that way, a 512 MiB region
  // cost 513 MiB more memory and 3 times the time (0.24 s against 0.08 s).
  size_t read_some(uint64_t at, void* out, size_t n) { return mem_.read_some(at, out, n); }
  census::TargetMemory mem_;
  int pagemap_;
  std::vector<uint64_t> buf_, span_;
  std::map<uint64_t, Piece> pieces_;
  uint64_t bytes_ = 0, unreadable_ = 0, tick_ = 0;
};

// `catch_up` runs with every thread stopped: the caller takes in what the threads published;
// `take_blocks` then returns the blocks live at that moment (with the threads stopped still,
// or after they were let go when reading a copy: the caller takes in nothing meanwhile).
// `fork_stub`: the hook library's syscall stub, to read a copy-on-write image of the target
// (forked_image.h) while it runs on (`ctl`: the segment's Control, as memhook maps it); 0, or
// a copy that cannot be made: read with the threads stopped, within `max_pause_ns`. On its own
// thread, which ends with the check: see
// thread_stop.h.
inline LeakCheck check_leaks(int pid, const std::vector<Range>& exclude, bool heaps_known,
                             uint64_t max_pause_ns, uint64_t fork_stub, Control* ctl,
                             const std::function<void()>& catch_up,
                             const std::function<std::vector<Block>()>& take_blocks) {
  LeakCheck out;
  std::thread worker([&] {
    const std::string proc = "/proc/" + std::to_string(pid);
    int mem = open((proc + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
    int pagemap = open((proc + "/pagemap").c_str(), O_RDONLY | O_CLOEXEC);
    const uint64_t t0 = monotonic_ns(), deadline = t0 + max_pause_ns;
    uint64_t scan_deadline = deadline;
    ForkedImage image;
    std::vector<StoppedThread> threads;
    std::unique_ptr<Marking> marking;
    {
      StoppedThreads stopped;
      bool held = false;
      if (mem < 0) {
        out.skipped = "cannot read the target's memory";
      } else if ((held = stopped.stop(pid, deadline, &out.skipped))) {
        out.threads = uint32_t(stopped.threads().size());
        const uint64_t t1 = monotonic_ns();
        out.stop_ns = t1 - t0;
        catch_up();
        const uint64_t t_fork = monotonic_ns();
        out.drain_ns = t_fork - t1;
        if (fork_stub && image.take(pid, stopped.mutable_threads(), fork_stub, ctl,
                                    &out.fork_failed)) {
          const std::string copy = "/proc/" + std::to_string(image.pid());
          const int cm = open((copy + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
          const int cp = open((copy + "/pagemap").c_str(), O_RDONLY | O_CLOEXEC);
          if (cm >= 0) {  // the copy's memory is read from here on: the target may run
            close(mem);
            if (pagemap >= 0) close(pagemap);
            mem = cm, pagemap = cp;
            out.forked = true;
            out.fork_ns = monotonic_ns() - t_fork;
            scan_deadline = monotonic_ns() + kForkedScanLimitNs;
          } else if (cp >= 0) {
            close(cp);
          }
        }
      }
      threads = stopped.threads();
      if (out.forked) {  // the pause ends here
        stopped.resume();
        out.pause_ns = monotonic_ns() - t0;
      }
      if (held) {
        const uint64_t t = monotonic_ns();
        marking = std::make_unique<Marking>(take_blocks());
        out.drain_ns += out.forked ? 0 : monotonic_ns() - t;
        // The maps as the blocks were: the copy's (made with every thread stopped), or the
        // stopped target's.
        out.roots = root_ranges(out.forked ? image.pid() : pid, marking->blocks(), threads,
                                exclude, heaps_known);
      }
      const uint64_t t2 = monotonic_ns();
      if (marking) {
        if (heaps_known) {  // (otherwise the heap's gaps, these blocks among them, are roots)
          census::TargetMemory tm(mem);
          for (const Range& r : dynamic_tls_blocks(tm, threads)) {
            out.roots.ranges.push_back(r);
            out.roots.add(r);
          }
        }
        BlockReader reader(mem, pagemap);  // (the copy's, when it was made)
        auto word = [&](uint64_t a, uint64_t* v) { return reader.word(a, v); };
        InteriorHeuristics<decltype(word)> heuristics(
            word, out.roots.readable_files, out.roots.executable_files,
            ctl && ctl->python.this_thread_state ? ctl->python.type_type : 0);
        marking->heuristic = [&](const Block& b, uint64_t p) { return heuristics(b, p); };
        auto more = [&] { return monotonic_ns() < scan_deadline; };
        for (const StoppedThread& t : threads) marking->scan(t.regs.data(), t.regs.size(), true);
        bool done = true;
        std::vector<uint64_t> shifted;
        for (const Range& r : out.roots.ranges) {
          reader.range(r.lo, r.hi, [&](const uint64_t* w, size_t n) {
            marking->scan(w, n, true);
            if (r.kind != kJitCode || n < 2) return;
            // A JIT's code: a word at every byte, as an immediate may lie (words across two
            // pieces of the read are missed: one position in 131072).
            shifted.resize(n - 1);
            for (int b = 1; b < 8; b++) {
              for (size_t i = 0; i + 1 < n; i++)
                shifted[i] = w[i] >> (8 * b) | w[i + 1] << (64 - 8 * b);
              marking->scan(shifted.data(), n - 1, true);
            }
          });
          if (!(done = marking->run([&](const auto& which, auto fn) {
                  reader.blocks(marking->blocks(), which, fn);
                }, more)))
            break;
        }
        if (done)
          done = marking->cliques([&](const auto& which, auto fn) {
            reader.blocks(marking->blocks(), which, fn);
          }, more);
        out.scan_ns = monotonic_ns() - t2;
        out.bytes_read = reader.bytes();
        out.unreadable_bytes = reader.unreadable();
        if (!done && out.forked)
          out.skipped = "the scan of the target's copy took longer than " +
                        std::to_string(kForkedScanLimitNs / 1000000000) + " s";
        else if (!done)
          out.skipped = "the check would have paused the target longer than --max-pause (" +
                        std::to_string(max_pause_ns / 1000000) + " ms)";
        else
          out.blocks = std::move(marking->blocks());
      }
      if (!out.forked) {
        stopped.resume();
        out.pause_ns = monotonic_ns() - t0;
      }
    }
    if (mem >= 0) close(mem);
    if (pagemap >= 0) close(pagemap);
    if (image.pid() && !image.release(pid, fork_stub, ctl, monotonic_ns() + kReapWaitNs,
                                      &out.reap_ns))
      out.not_reaped = true;
  });
  worker.join();
  return out;
}

}  // namespace memhook::reachability
