// The consumer, inside memhook: maps the session's segment, drains its rings on a native
// thread (ring_reader.h) into the stack table and the aggregates, and keeps the heartbeat the
// target watches. Python reads it through bindings.cpp.
#pragma once
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "aggregates.h"
#include "clock.h"
#include "ring_pages.h"
#include "ring_reader.h"
#include "segment.h"
#include "stack_table.h"
#include "unwind_rows.h"

namespace memhook {

class Consumer {
 public:
  // Takes its own duplicate of `segment_fd`.
  explicit Consumer(int segment_fd) {
    int fd = fcntl(segment_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("cannot use segment: ") + strerror(errno));
    fd_ = fd;
    struct stat st;
    if (fstat(fd, &st) != 0) throw std::runtime_error("cannot stat segment");
    bytes_ = (size_t)st.st_size;
    if (bytes_ < sizeof(Control)) throw std::runtime_error("segment has the wrong format");
    void* m = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) throw std::runtime_error("cannot map segment");
    base_ = (uint8_t*)m;
    ctl_ = (Control*)m;
    if (ctl_->magic != kMagic || ctl_->version != kVersion ||
        ctl_->depth > (uint32_t)kMaxDepth || ctl_->nrings > kMaxRings ||
        ctl_->unwind_bytes > kMaxUnwindBytes ||
        ctl_->python_bytes > kMaxCodeAreaBytes ||
        bytes_ < code_area_offset(*ctl_) + ctl_->python_bytes)
      throw std::runtime_error("segment has the wrong format");
    clock0_ = read_clock(ctl_->clock);
    ns0_ = monotonic_ns();
    reader_ = std::make_unique<RingReader>(base_, clock0_);
  }
  ~Consumer() {
    stop();
    if (base_) munmap(base_, bytes_);
    if (fd_ >= 0) close(fd_);
  }
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  static constexpr const char* kThreadName = "memhook drain";
  // Drain on a native thread: look at the rings every `busy_us` while events wait, `idle_us`
  // otherwise, and apply them when a look finds it due (RingReader::Look), or once they have
  // waited kDrainEveryNs. A ring that filled so far is a steady stream, not a burst the rings
  // hold: for kDrainEveryNs after, every look applies what it finds, as small drains whose
  // records are still in the caches (redis's events cost the consumer 55-75 ns each so, 61-86
  // ns in drains of a quarter ring: benchmarks/redis_consumer.py).
  void start(int busy_us, int idle_us) {
    if (thread_.joinable()) return;
    running_ = true;
    thread_ = std::thread([this, busy_us, idle_us] {
      // (named, as top -H and /proc/PID/task/TID/comm show it: benchmarks/python_import.py)
      pthread_setname_np(pthread_self(), kThreadName);
      uint64_t waiting_since = 0;  // the first look that found events waiting, since a drain
      uint64_t eager_until = 0;    // after a drain that was due: one at every look until then
      while (running_.load(std::memory_order_relaxed)) {
        const uint64_t t = monotonic_ns();
        __atomic_store_n(&ctl_->heartbeat_ns, t, __ATOMIC_RELAXED);
        uint32_t seen = __atomic_load_n(&ctl_->wake, __ATOMIC_ACQUIRE);
        pages_.ahead(base_, fd_);
        const RingReader::Look l = look();
        if (l.pending && !waiting_since) waiting_since = t;
        size_t n = 0;
        if (l.due || (l.pending && (t < eager_until || t - waiting_since >= kDrainEveryNs))) {
          n = drain(false);
          waiting_since = 0;
          if (l.due) eager_until = t + kDrainEveryNs;
        }
        // A drain that found much (a writer running ahead, toward a full ring) goes again at once.
        int us = n >= kDrainAgain ? 0 : l.pending ? busy_us : idle_us;
        struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
        // Woken early by a writer whose ring passed half full.
        syscall(SYS_futex, &ctl_->wake, FUTEX_WAIT, seen, &ts, nullptr, 0);
      }
    });
  }

  void stop() {
    running_ = false;
    if (thread_.joinable()) thread_.join();
  }

  // Look at every ring: whether events wait, and whether they are due (RingReader::look).
  RingReader::Look look() {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t t0 = monotonic_ns();
    const RingReader::Look l = reader_->look(read_clock(ctl_->clock), ticks_to_ns());
    busy_ns_ += monotonic_ns() - t0;
    return l;
  }

  // Drain every ring and apply what is ordered. Returns events applied.
  size_t drain(bool final, bool whole = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t t0 = monotonic_ns();
    size_t n = reader_->drain(final, read_clock(ctl_->clock), ticks_to_ns(), whole);
    busy_ns_ += monotonic_ns() - t0;
    return n;
  }

  // After the final drain, when frees were dropped: the address table's entry for every live
  // block, read from the target (`mem_fd`: its /proc/PID/mem) one page at a time, reconciles
  // the aggregates (Aggregates::reconcile). False, and nothing changed, when the table cannot
  // be read (the target has exited) or was never published.
  bool reconcile(int mem_fd) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t table = ctl_->table;
    if (!table) return false;
    constexpr uint64_t kPerPage = 4096 / 8;
    std::unordered_map<uint64_t, std::vector<uint64_t>> pages;  // page number -> its entries
    for (const LiveMap::Block& b : aggregates().live().entries()) {
      if (!b.key) continue;
      const uint64_t page = table_index(b.key).index / kPerPage;
      if (pages.count(page)) continue;
      std::vector<uint64_t>& words = pages[page];
      words.resize(kPerPage);
      if (pread(mem_fd, words.data(), 4096, (off_t)(table + page * 4096)) != 4096) return false;
    }
    aggregates().reconcile([&](uint64_t p) {
      const TableIndex ti = table_index(p);
      const uint64_t e = pages[ti.index / kPerPage][ti.index % kPerPage];
      // An entry names its latest event (never 0); another pointer's tag: taken since.
      if ((e >> kDepShift) == 0 || (e & kTagMask) != (ti.tag & kTagMask)) return TableSays::kUnknown;
      return (e & kLive) ? TableSays::kLive : TableSays::kFreed;
    });
    reconciled_ = true;
    return true;
  }
  bool reconciled() const { return reconciled_; }

  // Events the hooks dropped (the rings were full or all owned): all of them, and the frees;
  // and under --lossless the events that waited for room, their time, the waits that ran out.
  struct Dropped {
    uint64_t events = 0, frees = 0, waits = 0, wait_ns = 0, wait_timeouts = 0, wait_max_us = 0;
  };
  Dropped dropped_counts() const {
    if (released_) return dropped_at_release_;
    Dropped d{__atomic_load_n(&ctl_->dropped_no_ring, __ATOMIC_RELAXED),
              __atomic_load_n(&ctl_->dropped_frees_no_ring, __ATOMIC_RELAXED)};
    for (uint32_t i = 0; i < ctl_->nrings; i++) {
      d.events += __atomic_load_n(&reader_->ring(i)->dropped, __ATOMIC_RELAXED);
      d.frees += __atomic_load_n(&reader_->ring(i)->dropped_frees, __ATOMIC_RELAXED);
      d.waits += __atomic_load_n(&reader_->ring(i)->waits, __ATOMIC_RELAXED);
      d.wait_ns += __atomic_load_n(&reader_->ring(i)->wait_ns, __ATOMIC_RELAXED);
      d.wait_timeouts += __atomic_load_n(&reader_->ring(i)->wait_timeouts, __ATOMIC_RELAXED);
      d.wait_max_us = std::max<uint64_t>(
          d.wait_max_us, __atomic_load_n(&reader_->ring(i)->wait_max_us, __ATOMIC_RELAXED));
    }
    return d;
  }

  bool any_busy() const {
    for (uint32_t i = 0; i < ctl_->nrings; i++)
      if (__atomic_load_n(&reader_->ring(i)->busy, __ATOMIC_ACQUIRE)) return true;
    return false;
  }

  // After detach: give the rings' pages and the unwind area back (the target keeps an empty
  // mapping). Not the recent stacks (segment.h): a malloc hook that passed its mode check just
  // before detach and was preempted may still compare one, and a page of it read as zeros
  // after its first was read whole sent it through a null address (a target of 150 short
  // sessions segfaulted twice). They stay until the next session replaces the segment; at
  // most kRecentStacks entries per ring a thread claimed, and only the pages touched.
  void release_rings() {
    stop();
    std::lock_guard<std::mutex> lock(mutex_);
    dropped_at_release_ = dropped_counts();  // the counters live in the pages released below
    kept_code_ = code_records(0).first;        // and the code records (after the unwind area)
    released_ = true;
    const size_t rings = rings_offset(),
                 recent = recent_stacks_offset(ctl_->nrings, ctl_->ring_bytes),
                 unwind = unwind_offset(ctl_->nrings, ctl_->ring_bytes, ctl_->depth);
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)rings, (off_t)(recent - rings));
    if (bytes_ > unwind)
      fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)unwind,
                (off_t)(bytes_ - unwind));
  }

  // Nanoseconds of CLOCK_MONOTONIC for a raw event timestamp.
  double ticks_to_ns() const {
    if (ctl_->clock != kClockTsc) return 1.0;
    uint64_t dt = read_clock(ctl_->clock) - clock0_, dn = monotonic_ns() - ns0_;
    return dt ? double(dn) / double(dt) : 1.0;
  }

  // What Python reads, under the lock the drain holds.
  std::unique_lock<std::mutex> lock() const { return std::unique_lock<std::mutex>(mutex_); }
  const StackTable& stacks() const { return reader_->stacks(); }
  Aggregates& aggregates() { return reader_->aggregates(); }
  const Aggregates& aggregates() const { return reader_->aggregates(); }
  const Mappings& mappings() const { return reader_->mappings(); }

  // The allocator statistics reader the hook library is to start (allocator_stats.h), and what
  // it wrote: (state, values).
  void set_allocator_stats(uint64_t fn, uint32_t kind) {
    ctl_->stats_fn = fn;
    ctl_->stats_kind = kind;
    __atomic_store_n(&ctl_->stats_state, kStatsIdle, __ATOMIC_RELEASE);
  }
  std::pair<uint32_t, std::vector<uint64_t>> allocator_stats() const {
    const uint32_t state = __atomic_load_n(&ctl_->stats_state, __ATOMIC_ACQUIRE);
    return {state, std::vector<uint64_t>(ctl_->stats, ctl_->stats + kStatsValues)};
  }
  const Control& control() const { return *ctl_; }
  // Where the leak check leaves a thread's registers for the syscall stub (forked_image.h).
  Control* control_for_calls() { return ctl_; }
  uint64_t applied() const { return reader_->applied(); }
  uint64_t unordered() const { return reader_->unordered(); }
  uint64_t busy_ns() const { return busy_ns_; }
  uint64_t clock_origin() const { return clock0_; }
  uint64_t now() const { return read_clock(ctl_->clock); }
  bool started() const { return __atomic_load_n(&ctl_->started, __ATOMIC_ACQUIRE) != 0; }
  bool abandoned() const { return __atomic_load_n(&ctl_->abandoned, __ATOMIC_ACQUIRE) != 0; }
  uint64_t lib_base() const { return ctl_->lib_base; }
  uint32_t loads() const { return __atomic_load_n(&ctl_->loads, __ATOMIC_ACQUIRE); }
  // The libraries counted up to `loads` are known (their modules read): exit_check.h.
  void loads_read(uint32_t loads) { __atomic_store_n(&ctl_->loads_read, loads, __ATOMIC_RELEASE); }

  // A Python interpreter's layout for the hooks (python_frames.h), before injection.
  void set_python(const PythonLayout& layout) {
    ctl_->python = layout;
    if (layout.depth > kPythonDepth) ctl_->python.depth = kPythonDepth;
  }
  // The code records the hooks completed from byte `from` of the code area on (CodeRecord),
  // whole, and where the next begins: a record still being written ends the reading.
  std::pair<std::string, uint64_t> code_records(uint64_t from) const {
    if (released_) {  // (release_rings kept them)
      from = std::min<uint64_t>(from, kept_code_.size());
      return {kept_code_.substr(from), kept_code_.size()};
    }
    const uint64_t cap = ctl_->python_bytes;
    const uint64_t used = std::min(__atomic_load_n(&ctl_->python_used, __ATOMIC_ACQUIRE), cap);
    const uint8_t* area = base_ + code_area_offset(*ctl_);
    uint64_t at = from;
    while (at + sizeof(CodeRecord) <= used) {
      const uint32_t n = __atomic_load_n((const uint32_t*)(area + at), __ATOMIC_ACQUIRE);
      if (n < sizeof(CodeRecord) || n % 8 || at + n > used) break;
      at += n;
    }
    return {std::string((const char*)area + from, at - from), at};
  }
  uint64_t python_unrecorded() const {
    return __atomic_load_n(&ctl_->python_unrecorded, __ATOMIC_RELAXED);
  }

  // --follow-fork (hook_library/lifecycle.h): children forked with the hooks armed announce
  // themselves and wait until their entry is cleared.
  // The leak check at exit (hook_library/exit_check.h).
  void set_check_at_exit(bool on) {
    __atomic_store_n(&ctl_->check_at_exit, on ? 1u : 0u, __ATOMIC_RELEASE);
  }
  bool exit_announced() const {
    return __atomic_load_n(&ctl_->exit_state, __ATOMIC_ACQUIRE) == kExitAnnounced;
  }
  void exit_done() { __atomic_store_n(&ctl_->exit_state, (uint32_t)kExitDone, __ATOMIC_RELEASE); }
  void set_follow_forks(bool on) {
    __atomic_store_n(&ctl_->follow_forks, on ? 1u : 0u, __ATOMIC_RELEASE);
  }
  std::vector<int32_t> forked() const {
    std::vector<int32_t> out;
    const uint32_t n = std::min<uint32_t>(__atomic_load_n(&ctl_->nforked, __ATOMIC_ACQUIRE),
                                          (uint32_t)kMaxForked);
    for (uint32_t i = 0; i < n; i++)
      if (int32_t pid = __atomic_load_n(&ctl_->forked[i], __ATOMIC_ACQUIRE)) out.push_back(pid);
    return out;
  }
  // A thread about to exec (following.h): its tid while it waits for memhook, else 0.
  int32_t exec_announced() const {  // an exec or a spawn (exec_state() says which)
    const uint32_t state = __atomic_load_n(&ctl_->exec_state, __ATOMIC_ACQUIRE);
    return state == kExecAnnounced || state == kSpawnAnnounced
               ? __atomic_load_n(&ctl_->exec_tid, __ATOMIC_ACQUIRE)
               : 0;
  }
  uint32_t exec_state() const { return __atomic_load_n(&ctl_->exec_state, __ATOMIC_ACQUIRE); }
  void exec_go() { __atomic_store_n(&ctl_->exec_state, (uint32_t)kExecGo, __ATOMIC_RELEASE); }
  void exec_done() {  // memhook let go of the thread: the next exec may announce itself
    __atomic_store_n(&ctl_->exec_state, (uint32_t)kExecNone, __ATOMIC_RELEASE);
    __atomic_store_n(&ctl_->exec_tid, 0, __ATOMIC_RELEASE);
  }
  void release_forked(int32_t pid) {
    const uint32_t n = std::min<uint32_t>(__atomic_load_n(&ctl_->nforked, __ATOMIC_ACQUIRE),
                                          (uint32_t)kMaxForked);
    for (uint32_t i = 0; i < n; i++) {
      int32_t expected = pid;
      __atomic_compare_exchange_n(&ctl_->forked[i], &expected, 0, false, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE);
    }
  }
  // The unwind area memhook fills (unwind_rows.h), or null when the segment has none.
  UnwindArea* unwind_area() const {
    if (!ctl_->unwind_bytes || released_) return nullptr;
    return (UnwindArea*)(base_ + unwind_offset(ctl_->nrings, ctl_->ring_bytes, ctl_->depth));
  }
  // After a new unwind index is published: every recent stack emptied, as its walk may have
  // followed rows no longer published. A walk that ends meanwhile empties its own
  // (frame_walk.h: it reads the index again after keeping it).
  void forget_recent_stacks() {
    if (released_) return;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint8_t* const at = base_ + recent_stacks_offset(ctl_->nrings, ctl_->ring_bytes);
    const size_t stride = recent_stack_stride(ctl_->depth);
    for (size_t i = 0; i < size_t(ctl_->nrings) * kRecentStacks; i++)
      __atomic_store_n(&((RecentStack*)(at + i * stride))->ret0, 0, __ATOMIC_RELAXED);
  }

 private:
  static constexpr size_t kDrainAgain = 16384;  // events in one drain: no sleep before the next
  static constexpr uint64_t kDrainEveryNs = 100000000;  // events wait no longer to be applied

  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
  Control* ctl_ = nullptr;
  std::unique_ptr<RingReader> reader_;  // once the control block is checked
  RingPages pages_;                     // (the drain thread's)
  uint64_t clock0_ = 0, ns0_ = 0, busy_ns_ = 0;
  mutable std::mutex mutex_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  bool released_ = false;
  bool reconciled_ = false;
  Dropped dropped_at_release_;
  std::string kept_code_;  // the code records, once release_rings gave their pages back
};

}  // namespace memhook
