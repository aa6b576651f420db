// memhook._native: formats the shared segment, drains its rings and aggregates outstanding bytes
// per unique backtrace.
//
// Applying the per-thread rings. Each ring is applied in order, in place; an event that depends
// on another ring's event (segment.h: a pointer freed on one thread and reused on another) waits
// until that ring has applied it, and its ring waits with it. Dependencies follow the allocator's
// own happens-before order, so they never form a cycle; one whose event will never come (its
// writer died inside a hook) is given up after kStuckNs, and the final drain after detach gives
// up whatever is left. Time: each ring's latest clock record, never earlier than the previous
// drain (an event seen now was published after the last look), monotonic in apply order.
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/futex.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "segment.h"

namespace py = pybind11;
using namespace memhook;

namespace {

struct HookInfo {
  int id;
  const char* symbol;
  const char* name;
  char kind;
};
const HookInfo kHooks[] = {
#define HOOK(id, sym, name, kind, ret, params, args) {id, #sym, name, #kind[0]},
#include "hooks.def"
#undef HOOK
};

uint64_t monotonic_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + ts.tv_nsec;
}

uint64_t read_clock(uint32_t clock) {
  if (clock != kClockTsc) return monotonic_ns();
  unsigned aux;
  _mm_lfence();
  uint64_t t = __rdtscp(&aux);
  _mm_lfence();
  return t;
}

struct Event {
  uint64_t ts;
  uint64_t ptr;
  uint64_t size;
  uint64_t hook_frame;    // where on the thread's stack the hook ran (0: unknown)
  uint64_t caller_frame;  // allocations: frame base of the allocating function (0: unknown)
  uint32_t stack;
  uint32_t tid;
  uint8_t op;
  uint8_t is_free;
  uint64_t event = 0;  // allocations: the event's own name, as a dependency would give it
};

// One applied event, as --record-events keeps it (numpy dtype EVENT_DTYPE in Python). Not an
// Event: these bytes go into capture files, so the padding is explicit and zeroed, never a
// leftover of memhook's own memory.
struct LoggedEvent {
  uint64_t ts;  // raw clock; Python converts with ticks_to_ns()
  uint64_t ptr;
  uint64_t size;
  uint32_t stack;
  uint32_t tid;
  uint8_t op;
  uint8_t is_free;
  uint8_t pad[6];
};

struct Site {
  uint64_t alloc_count = 0, alloc_bytes = 0, free_count = 0, free_bytes = 0;
  uint64_t out_count = 0, out_bytes = 0, op_mask = 0;
  // Behaviour: who freed (the allocating thread or another), and heaptrack's "temporary":
  // freed before its thread allocated anything else.
  uint64_t freed_same_thread = 0, freed_other_thread = 0, temporary = 0;
  uint64_t freed_same_call = 0;  // freed while the allocating call was still active
  // Sampling mode: each sampled block stands for 1/P blocks (P its chance of being sampled).
  double est_alloc_count = 0, est_alloc_bytes = 0, est_free_count = 0, est_free_bytes = 0;
};

constexpr int kBuckets = 48;  // log2 histograms: bucket b holds values in [2^b, 2^(b+1))
inline int log2_bucket(uint64_t v) { return v ? std::min(63 - __builtin_clzll(v), kBuckets - 1) : 0; }

// Live blocks by address: open addressing, linear probing, backward-shift deletion (no
// tombstones). Addresses are never 0, so key 0 marks an empty slot.
class LiveMap {
 public:
  struct Slot {
    uint64_t key;
    uint64_t size;
    uint64_t ts;  // when it was allocated (raw clock)
    uint32_t stack;
    uint32_t tid;  // which thread allocated it
    uint32_t call_index, call_seq;  // its allocating call in the thread's active frames
    uint64_t event;  // its allocation, named as a dependency would name it
  };

  LiveMap() { resize(1 << 16); }

  Slot* find(uint64_t key) {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i];
      if (!slots_[i].key) return nullptr;
    }
  }

  // The slot for `key`, created empty (size 0, stack 0) if absent; `inserted` tells which.
  Slot* insert(uint64_t key, bool* inserted) {
    if ((count_ + 1) * 2 > slots_.size()) resize(slots_.size() * 2);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) {
        *inserted = false;
        return &slots_[i];
      }
      if (!slots_[i].key) {
        slots_[i] = Slot{key, 0, 0, 0, 0, 0, 0, 0};
        count_++;
        *inserted = true;
        return &slots_[i];
      }
    }
  }

  void erase(Slot* s) {
    size_t i = s - slots_.data();
    for (size_t j = (i + 1) & mask_; slots_[j].key; j = (j + 1) & mask_) {
      size_t home = hash(slots_[j].key) & mask_;
      // Slot j may move back to i unless its home lies cyclically in (i, j].
      bool stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = 0;
    count_--;
  }

  size_t size() const { return count_; }
  const std::vector<Slot>& slots() const { return slots_; }

 private:
  // Neighbouring blocks get neighbouring slots (allocators hand out runs of adjacent blocks,
  // and their slots then share cache lines); each 1 MiB window of addresses starts at its own
  // random offset, so windows at round distances (arenas, mmaps) do not pile up.
  static size_t hash(uint64_t k) {
    return (size_t)((k >> 4) ^ ((k >> 20) * 0x9E3779B97F4A7C15ull >> 24));
  }

  void resize(size_t n) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(n, Slot{0, 0, 0, 0, 0, 0, 0, 0});
    mask_ = n - 1;
    count_ = 0;
    bool inserted;
    for (const Slot& s : old)
      if (s.key) *insert(s.key, &inserted) = s;
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0, count_ = 0;
};

class Consumer {
 public:
  // Takes its own duplicate of `segment_fd`.
  explicit Consumer(int segment_fd) {
    int fd = fcntl(segment_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("cannot use segment: ") + strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      close(fd);
      throw std::runtime_error("cannot stat segment");
    }
    bytes_ = (size_t)st.st_size;
    void* m = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    fd_ = fd;
    if (m == MAP_FAILED) throw std::runtime_error("cannot map segment");
    base_ = (uint8_t*)m;
    ctl_ = (Control*)m;
    if (ctl_->magic != kMagic || ctl_->version != kVersion ||
        ctl_->depth > (uint32_t)kMaxDepth ||
        bytes_ < segment_bytes(ctl_->nrings, ctl_->ring_bytes, ctl_->depth))
      throw std::runtime_error("segment has the wrong format");
    rings_.assign(ctl_->nrings, RingState{});
    sample_rate_ = double(ctl_->sample_rate);
    stacks_.push_back({});  // stack id 0: none
    stack_next_.push_back(0);
    stack_offsets_.push_back(0);
    sites_.push_back({});
    size_hist_.resize(kBuckets);
    life_hist_.resize(kBuckets);
    clock0_ = read_clock(ctl_->clock);
    ns0_ = monotonic_ns();
    prev_drain_ts_ = clock0_;
  }
  ~Consumer() {
    stop();
    if (base_) munmap(base_, bytes_);
    if (fd_ >= 0) close(fd_);
  }

  // Drain continuously on a native thread: every `busy_us` while events arrive, `idle_us`
  // otherwise. Python only reads the aggregates.
  void start(int busy_us, int idle_us) {
    if (thread_.joinable()) return;
    running_ = true;
    thread_ = std::thread([this, busy_us, idle_us] {
      while (running_.load(std::memory_order_relaxed)) {
        __atomic_store_n(&ctl_->heartbeat_ns, monotonic_ns(), __ATOMIC_RELAXED);
        uint32_t seen = __atomic_load_n(&ctl_->wake, __ATOMIC_ACQUIRE);
        size_t n = drain(false);
        // A drain that found much (a writer running ahead, toward a full ring) goes again at once.
        int us = n >= kDrainAgain ? 0 : n ? busy_us : idle_us;
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

  // Drain every ring and apply what is ordered. Returns events applied.
  size_t drain(bool final) {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t t0 = monotonic_ns();
    size_t n = drain_locked(final);
    busy_ns_ += monotonic_ns() - t0;
    parsed_ += n;
    return n;
  }

  size_t drain_locked(bool final) {
    ns_per_tick_ = ticks_to_ns();
    const uint64_t drain_ts = read_clock(ctl_->clock);
    size_t total = 0, passes = 0;
    for (;;) {
      size_t n = 0;
      bool blocked = false;
      for (uint32_t i = 0; i < ctl_->nrings; i++) n += apply_ring(i, final, &blocked);
      total += n;
      if (n && blocked && ++passes < 64) continue;  // what was applied may unblock a ring
      if (n) break;
      // No ring can move. Only the final drain gives up a dependency (the oldest-numbered
      // blocked ring's), since nothing more will be published.
      if (!final || !blocked) break;
      for (uint32_t i = 0; i < ctl_->nrings; i++)
        if (rings_[i].blocked) {
          rings_[i].force = true;
          break;
        }
    }
    prev_drain_ts_ = drain_ts;
    applied_ += total;
    return total;
  }

  // Events the hooks dropped (the rings were full or all owned): all of them, and the frees.
  struct Dropped {
    uint64_t events = 0, frees = 0;
  };
  Dropped dropped_counts() const {
    if (released_) return dropped_at_release_;
    Dropped d{__atomic_load_n(&ctl_->dropped_no_ring, __ATOMIC_RELAXED),
              __atomic_load_n(&ctl_->dropped_frees_no_ring, __ATOMIC_RELAXED)};
    for (uint32_t i = 0; i < ctl_->nrings; i++) {
      d.events += __atomic_load_n(&ring(i)->dropped, __ATOMIC_RELAXED);
      d.frees += __atomic_load_n(&ring(i)->dropped_frees, __ATOMIC_RELAXED);
    }
    return d;
  }

  py::dict totals() const {
    std::lock_guard<std::mutex> lock(mutex_);
    Site t;
    uint64_t samples = 0;
    for (const Site& raw : sites_) {
      const Site s = estimated(raw);
      samples += raw.alloc_count;
      t.alloc_count += s.alloc_count;
      t.alloc_bytes += s.alloc_bytes;
      t.free_count += s.free_count;
      t.free_bytes += s.free_bytes;
      t.out_count += s.out_count;
      t.out_bytes += s.out_bytes;
    }
    py::dict d;
    d["alloc_count"] = t.alloc_count;
    d["alloc_bytes"] = t.alloc_bytes;
    d["free_count"] = t.free_count;
    d["free_bytes"] = t.free_bytes;
    d["outstanding_count"] = t.out_count;
    d["outstanding_bytes"] = t.out_bytes;
    d["unknown_free_count"] = unknown_frees_;
    const Dropped dropped = dropped_counts();
    d["dropped_events"] = dropped.events;
    d["dropped_frees"] = dropped.frees;
    d["replaced_live_count"] = replaced_live_;
    d["events"] = applied_;
    d["unordered_events"] = unordered_;
    d["sample_rate"] = (uint64_t)sample_rate_;
    d["sampled_allocations"] = samples;
    d["consumer_busy_ns"] = busy_ns_;
    d["parsed_events"] = parsed_;
    return d;
  }

  // Per-stack aggregates as numpy columns, indexed by stack id (row 0 is unused).
  py::dict sites() const {
    std::lock_guard<std::mutex> lock(mutex_);
    py::dict d;
    site_columns(d, {"alloc_count", "alloc_bytes", "free_count", "free_bytes",
                     "outstanding_count", "outstanding_bytes", "op_mask"},
                 {&Site::alloc_count, &Site::alloc_bytes, &Site::free_count, &Site::free_bytes,
                  &Site::out_count, &Site::out_bytes, &Site::op_mask});
    return d;
  }

  // Unique stacks with ids >= since: the frames of stack since+i are
  // frames[offsets[i]-offsets[0] : offsets[i+1]-offsets[0]].
  py::tuple stacks(size_t since) const {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = stack_offsets_.size();
    since = std::min(since, n);
    py::array_t<uint64_t> offsets(n - since + 1);
    auto o = offsets.mutable_unchecked<1>();
    for (size_t i = since; i < n; i++) o(i - since) = stack_offsets_[i];
    o(n - since) = frames_.size();
    size_t first = since < n ? stack_offsets_[since] : frames_.size();
    py::array_t<uint64_t> frames(frames_.size() - first);
    std::memcpy(frames.mutable_data(), frames_.data() + first, (frames_.size() - first) * 8);
    return py::make_tuple(offsets, frames);
  }

  // Every block still live: ptr, size, stack, tid, ts (raw clock), as parallel numpy arrays.
  py::dict live_blocks() const {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = live_.size(), j = 0;
    py::array_t<uint64_t> ptr(n), size(n), ts(n);
    py::array_t<uint32_t> stack(n), tid(n);
    auto P = ptr.mutable_unchecked<1>(), S = size.mutable_unchecked<1>(), T = ts.mutable_unchecked<1>();
    auto K = stack.mutable_unchecked<1>(), D = tid.mutable_unchecked<1>();
    for (const auto& b : live_.slots()) {
      if (!b.key) continue;
      P(j) = b.key;
      S(j) = b.size;
      T(j) = b.ts;
      K(j) = b.stack;
      D(j) = b.tid;
      j++;
    }
    py::dict d;
    d["ptr"] = ptr;
    d["size"] = size;
    d["ts"] = ts;
    d["stack"] = stack;
    d["tid"] = tid;
    return d;
  }

  // Behaviour per stack: free locality, temporaries, size and lifetime histograms and the ages
  // of live blocks (rows by stack id), and (stack, alloc tid, free tid, count) for every
  // cross-thread pair seen.
  py::dict behaviour() const {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = sites_.size();
    py::dict d;
    site_columns(d, {"freed_same_thread", "freed_other_thread", "temporary", "freed_same_call"},
                 {&Site::freed_same_thread, &Site::freed_other_thread, &Site::temporary,
                  &Site::freed_same_call});
    for (auto [name, hist] : {std::make_pair("size_hist", &size_hist_),
                              std::make_pair("lifetime_hist", &life_hist_)}) {
      py::array_t<uint64_t> a({n, (size_t)kBuckets});
      std::memcpy(a.mutable_data(), hist->data(), n * kBuckets * 8);
      d[name] = a;
    }
    // Ages of the blocks live now, per stack: bounded by the stacks, however large the heap.
    py::array_t<uint64_t> ages({n, (size_t)kBuckets});
    uint64_t* age = ages.mutable_data();
    std::memset(age, 0, n * kBuckets * 8);
    uint64_t now = read_clock(ctl_->clock);
    double per_tick = ticks_to_ns();
    for (const auto& b : live_.slots())
      if (b.key && b.stack < n)
        age[size_t(b.stack) * kBuckets +
            log2_bucket(now > b.ts ? (uint64_t)((now - b.ts) * per_tick) : 0)]++;
    d["age_hist"] = ages;
    size_t m = thread_pairs_.size(), j = 0;
    py::array_t<uint64_t> stack(m), atid(m), ftid(m), count(m);
    for (const auto& [k, c] : thread_pairs_) {
      stack.mutable_data()[j] = k.stack;
      atid.mutable_data()[j] = k.alloc_tid;
      ftid.mutable_data()[j] = k.free_tid;
      count.mutable_data()[j++] = c;
    }
    d["pair_stack"] = stack;
    d["pair_alloc_tid"] = atid;
    d["pair_free_tid"] = ftid;
    d["pair_count"] = count;
    return d;
  }

  void record_events(bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    record_events_ = on;
  }

  // The events applied since the last call, as raw bytes of LoggedEvent records.
  py::bytes take_events() {
    std::lock_guard<std::mutex> lock(mutex_);
    py::bytes out((const char*)log_.data(), log_.size() * sizeof(LoggedEvent));
    log_.clear();
    return out;
  }

  std::vector<py::tuple> late_slots() const {
    std::vector<py::tuple> out;
    uint32_t n = std::min<uint32_t>(__atomic_load_n(&ctl_->nlate, __ATOMIC_ACQUIRE), kMaxLateSlots);
    for (uint32_t i = 0; i < n; i++) {
      const PatchedSlot& s = ctl_->late[i];
      out.push_back(py::make_tuple(s.addr, s.original, s.hook, s.hook_id, s.state));
    }
    return out;
  }

  uint64_t clock_origin() const { return clock0_; }
  bool started() const { return __atomic_load_n(&ctl_->started, __ATOMIC_ACQUIRE) != 0; }
  bool abandoned() const { return __atomic_load_n(&ctl_->abandoned, __ATOMIC_ACQUIRE) != 0; }
  uint64_t lib_base() const { return ctl_->lib_base; }

  bool any_busy() const {
    for (uint32_t i = 0; i < ctl_->nrings; i++)
      if (__atomic_load_n(&ring(i)->busy, __ATOMIC_ACQUIRE)) return true;
    return false;
  }

  // After detach: give the ring pages back (the target keeps an empty mapping).
  void release_rings() {
    stop();
    std::lock_guard<std::mutex> lock(mutex_);
    dropped_at_release_ = dropped_counts();  // the counters live in the pages released below
    released_ = true;
    size_t off = rings_offset();
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)(bytes_ - off));
  }

  // Nanoseconds of CLOCK_MONOTONIC for a raw event timestamp.
  double ticks_to_ns() const {
    if (ctl_->clock != kClockTsc) return 1.0;
    uint64_t dt = read_clock(ctl_->clock) - clock0_, dn = monotonic_ns() - ns0_;
    return dt ? double(dn) / double(dt) : 1.0;
  }

 private:
  // Site fields as numpy columns named `names`, one row per stack id.
  void site_columns(py::dict& d, std::initializer_list<const char*> names,
                    std::initializer_list<uint64_t Site::*> fields) const {
    auto name = names.begin();
    for (uint64_t Site::*field : fields) {
      py::array_t<uint64_t> a(sites_.size());
      auto v = a.mutable_unchecked<1>();
      for (size_t i = 0; i < sites_.size(); i++) v(i) = estimated(sites_[i]).*field;
      d[*name++] = a;
    }
  }

  RingHeader* ring(uint32_t i) const {
    return (RingHeader*)(base_ + rings_offset() + size_t(i) * ring_stride(ctl_->ring_bytes));
  }

  struct RingState {
    uint64_t read = 0;     // cursor past the last event applied
    uint64_t seen_write = 0;  // the writer's cursor at the previous look
    uint64_t ts = 0;       // its latest clock record
    uint32_t tid = 0;      // its writer (kThread records)
    bool blocked = false;  // its next event waits for another ring
    bool force = false;    // apply the next event without waiting
    uint64_t blocked_at = UINT64_MAX, blocked_since = 0;  // cursor it waits at, since when
    struct Held {
      uint64_t depth;  // its depth bits (a pointer word's), from the record that filled it
      uint32_t stack;
    } slots[kStackSlots] = {};  // the stack each of its stack slots holds
  };

  // A frame's depth (segment.h) as an address-like number: deeper frames are lower, as on the
  // stack itself; 0 stays unknown.
  static uint64_t pseudo_frame(uint64_t word) {
    uint64_t depth = word >> kPtrBits;
    return depth ? (uint64_t(1) << 40) - (depth << 4) : 0;
  }

  // Has the event named by `dep` been applied? It has unless it starts between its ring's read
  // cursor and the end of what that ring published (or is about to: an event is entered in the
  // address table before it is published, perhaps after a padding record). A ring's own
  // dependencies are met by applying it in order.
  bool satisfied(uint64_t dep, uint32_t own) const {
    uint32_t no = uint32_t(dep >> 32);
    if (!dep || no == own + 1 || no == 0 || no > ctl_->nrings) return true;
    const RingHeader* r = ring(no - 1);
    uint32_t start = (uint32_t)dep;
    uint32_t read = uint32_t(rings_[no - 1].read >> 3);
    uint32_t ahead = uint32_t(__atomic_load_n(&r->write, __ATOMIC_ACQUIRE) >> 3) - read;
    uint32_t slack = 8 + 2 * kMaxDepth;  // the largest record, in words
    return uint32_t(start - read) > ahead + slack;
  }

  // A block allocated while the map still holds it live from another thread: its free must be
  // published in a ring not yet applied (a free is published before the real call, an allocation
  // after it). Backs up a dependency the address table lost to a colliding pointer, or one that
  // names another pointer's event: the malloc hook sends the entry's without asking whose it is.
  bool free_pending(uint8_t kind, uint64_t dep, const uint64_t* at, const RingState& rs,
                    uint32_t index) {
    if (kind == kFree || (kind == kRealloc && ((at[3] ^ at[1]) & kPtrMask) == 0)) return false;
    const LiveMap::Slot* b = live_.find(at[1] & kPtrMask);
    if (!b || b->tid == rs.tid) return false;
    if (dep == b->event) return false;  // its allocation was the block's latest event: free lost
    for (uint32_t j = 0; j < ctl_->nrings; j++)
      if (j != index && rings_[j].read < __atomic_load_n(&ring(j)->write, __ATOMIC_ACQUIRE))
        return true;
    return false;  // nothing left to wait for: the free was lost
  }

  // Waits longer than kStuckNs at one cursor are given up: the event waited for will not come.
  bool wait_at(RingState& rs, uint64_t cursor) {
    uint64_t now = monotonic_ns();
    if (rs.blocked_at != cursor) {
      rs.blocked_at = cursor;
      rs.blocked_since = now;
    }
    if (now - rs.blocked_since <= kStuckNs) return true;
    unordered_++;
    return false;
  }

  // Apply ring `index` in order until it is empty or waits (the final drain takes everything
  // published). Returns events applied.
  size_t apply_ring(uint32_t index, bool final, bool* any_blocked) {
    RingHeader* r = ring(index);
    RingState& rs = rings_[index];
    const uint64_t cap = ctl_->ring_bytes;
    const uint8_t* data = (const uint8_t*)(r + 1);
    const uint64_t w = __atomic_load_n(&r->write, __ATOMIC_ACQUIRE);
    uint64_t rd = r->read;
    if (w - rd > cap) rd = w - cap;  // corrupt cursor: never read outside the ring
    // While the writer is moving, leave the cache line it is filling alone: reading it would
    // take the line away from the writer's core in the middle of its records.
    const uint64_t limit = (w == rs.seen_write || final) ? w : w & ~uint64_t(63);
    rs.seen_write = w;
    size_t n = 0;
    rs.blocked = false;
    rs.read = rd;
    while (rd < limit) {
      const uint64_t pos = rd & (cap - 1);
      const uint64_t* at = (const uint64_t*)(data + pos);
      const uint64_t hdr = at[0];
      const uint8_t kind = hdr & 0xff, op = (hdr >> 8) & 0xff;
      const uint32_t nf = std::min<uint32_t>((hdr >> 16) & 0xff, kMaxDepth);
      const uint64_t aux = hdr >> kDepShift;
      if (kind == kPadding) {
        rd += cap - pos;
        continue;
      }
      size_t words = kind == kAlloc ? 3 + nf : kind == kRealloc ? 5 + nf
                   : kind == kFree || kind == kTime ? 2 : 1;
      if (kind > kThread || pos + 8 * words > cap || rd + 8 * words > w) {
        rd = w;  // malformed: skip what is there
        break;
      }
      if (rd + 8 * words > limit) break;  // ends in the line being written: next time
      const uint64_t dep_old = kind == kRealloc ? at[4] : 0;
      if ((kind == kAlloc || kind == kFree || kind == kRealloc) && !rs.force &&
          !(satisfied(aux, index) && satisfied(dep_old, index) &&
            !free_pending(kind, aux, at, rs, index)) &&
          wait_at(rs, rd)) {
        rs.blocked = *any_blocked = true;
        break;
      }
      rs.force = false;
      const uint64_t event = event_name(index + 1, rd);
      rd += 8 * words;
      if (kind == kTime) {
        rs.ts = std::max(rs.ts, at[1]);
        continue;
      }
      if (kind == kThread) {
        rs.tid = (uint32_t)aux;
        continue;
      }
      n++;
      uint64_t ts = std::max({rs.ts, prev_drain_ts_, last_ts_});
      last_ts_ = ts;
      const uint64_t ptr = at[1] & kPtrMask;
      // An allocation's stack slot: one with frames fills it, one without repeats it.
      const uint32_t slot = kind == kFree ? 0 : uint32_t(at[2] >> kSlotShift);  // 1 + it, or 0
      RingState::Held* const held = slot && slot <= kStackSlots ? &rs.slots[slot - 1] : nullptr;
      if (held && nf) held->depth = at[1] & ~kPtrMask;
      const uint64_t frame = pseudo_frame(held && !nf ? held->depth : at[1]);
      if (kind == kFree) {
        apply({ts, ptr, 0, frame, 0, 0, rs.tid, op, 1});
      } else if (kind == kAlloc || kind == kRealloc) {
        // The allocating call's frame bounds the hook's from above: frames below it returned.
        const uint64_t below = frame ? frame - 1 : 0;
        if (kind == kRealloc) apply({ts, at[3] & kPtrMask, 0, below, 0, 0, rs.tid, op, 1});
        uint32_t stack;
        if (nf == 0) {  // the slot's stack (a walk yields at least the call site)
          stack = held ? held->stack : 0;
        } else {
          stack = intern(at + (kind == kAlloc ? 3 : 5), nf);
          if (held) held->stack = stack;
        }
        apply({ts, ptr, at[2] & kSizeMask, below, frame, stack, rs.tid, op, 0, event});
      }
      rs.read = rd;  // satisfied() looks here
    }
    __atomic_store_n(&r->read, rd, __ATOMIC_RELEASE);
    return n;
  }

  // One multiply per frame, off the chain that carries the hash from frame to frame.
  static uint64_t hash_frames(const uint64_t* f, uint32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (uint32_t i = 0; i < n; i++) h = ((h << 7) | (h >> 57)) ^ (f[i] * 0xff51afd7ed558ccdull);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
  }

  static bool same_frames(const uint64_t* a, const uint64_t* b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
      if (a[i] != b[i]) return false;
    return true;
  }

  uint32_t intern(const uint64_t* f, uint32_t n) {
    uint64_t h = hash_frames(f, n);
    // Most events repeat a recent stack: a direct-mapped cache in front of the map.
    auto& hot = recent_[h & (kRecent - 1)];
    if (hot.first == h) {
      const auto& s = stacks_[hot.second];
      if (s.second == n && same_frames(f, frames_.data() + s.first, n)) return hot.second;
    }
    uint32_t found = find_stack(h, f, n);
    hot = {h, found};
    return found;
  }

  uint32_t find_stack(uint64_t h, const uint64_t* f, uint32_t n) {
    auto it = by_hash_.find(h);
    uint32_t id = it == by_hash_.end() ? 0 : it->second;
    for (; id; id = stack_next_[id]) {
      const auto& s = stacks_[id];
      if (s.second == n && same_frames(f, frames_.data() + s.first, n)) return id;
    }
    id = (uint32_t)stacks_.size();
    stacks_.push_back({frames_.size(), n});
    stack_offsets_.push_back(frames_.size());
    frames_.insert(frames_.end(), f, f + n);
    stack_next_.push_back(it == by_hash_.end() ? 0 : it->second);
    by_hash_[h] = id;
    sites_.push_back({});
    size_hist_.resize(sites_.size() * kBuckets);
    life_hist_.resize(sites_.size() * kBuckets);
    return id;
  }

  // Per thread, the allocating calls still active, innermost last: an event whose hook ran at
  // or above a call's frame means that call has returned. Bounded by call depth: blocks
  // allocated by one call share its entry.
  struct ActiveCall {
    uint64_t frame;
    uint32_t seq;
  };
  struct ThreadCalls {
    uint32_t tid = 0, next_seq = 0;
    std::vector<ActiveCall> calls;
  };

  ThreadCalls& calls_of(uint32_t tid, uint64_t hook_frame) {
    ThreadCalls& c = thread_calls_[tid & (kLastAllocSlots - 1)];
    if (c.tid != tid) {  // first sight of the thread (or a collision): start afresh
      c.tid = tid;
      c.calls.clear();
    }
    while (hook_frame && !c.calls.empty() && c.calls.back().frame <= hook_frame) c.calls.pop_back();
    return c;
  }

  // Sampling mode: a sampled block of `size` stands for 1 / P(sampled) blocks in the estimates
  // (unused, and not kept, when every call is traced).
  void add_estimate(double& count, double& bytes, uint64_t size) const {
    if (sample_rate_ <= 0) return;
    const double w = 1.0 / -std::expm1(-double(size) / sample_rate_);
    count += w;
    bytes += w * double(size);
  }

  // A site's counts, estimated from the samples in sampling mode (exact otherwise).
  Site estimated(const Site& s) const {
    if (sample_rate_ <= 0) return s;
    Site e = s;
    auto whole = [](double v) { return v > 0 ? (uint64_t)std::llround(v) : uint64_t(0); };
    e.alloc_count = whole(s.est_alloc_count);
    e.alloc_bytes = whole(s.est_alloc_bytes);
    e.free_count = whole(s.est_free_count);
    e.free_bytes = whole(s.est_free_bytes);
    e.out_count = whole(s.est_alloc_count - s.est_free_count);
    e.out_bytes = whole(s.est_alloc_bytes - s.est_free_bytes);
    return e;
  }

  __attribute__((always_inline)) void apply(const Event& e) {
    ThreadCalls& calls = calls_of(e.tid, e.hook_frame);
    if (e.is_free) {
      LiveMap::Slot* b = live_.find(e.ptr);
      if (!b) {
        unknown_frees_++;
        return;
      }
      if (record_events_) log_.push_back({e.ts, e.ptr, b->size, b->stack, e.tid, e.op, 1, {}});
      Site& s = sites_[b->stack];
      s.free_count++;
      s.free_bytes += b->size;
      add_estimate(s.est_free_count, s.est_free_bytes, b->size);
      s.out_count--;
      s.out_bytes -= b->size;
      if (b->tid == e.tid) {
        s.freed_same_thread++;
        if (b->call_seq && b->call_index < calls.calls.size() &&
            calls.calls[b->call_index].seq == b->call_seq)
          s.freed_same_call++;
      } else {
        s.freed_other_thread++;
        thread_pairs_[ThreadPair{b->stack, b->tid, e.tid}]++;  // rare: only these are mapped
      }
      LastAlloc& last = last_alloc_[e.tid & (kLastAllocSlots - 1)];
      if (last.tid == e.tid && last.ptr == e.ptr) s.temporary++;
      last.ptr = 0;
      uint64_t lifetime = e.ts > b->ts ? (uint64_t)((e.ts - b->ts) * ns_per_tick_) : 0;
      life_hist_[size_t(b->stack) * kBuckets + log2_bucket(lifetime)]++;
      live_.erase(b);
      return;
    }
    bool inserted;
    LiveMap::Slot* b = live_.insert(e.ptr, &inserted);
    if (!inserted) {
      // The block's free was lost (dropped): it cannot still be outstanding.
      Site& old = sites_[b->stack];
      old.out_count--;
      old.out_bytes -= b->size;
      add_estimate(old.est_free_count, old.est_free_bytes, b->size);
      replaced_live_++;
    }
    b->stack = e.stack;
    b->size = e.size;
    b->ts = e.ts;
    b->tid = e.tid;
    b->call_seq = 0;
    b->event = e.event;
    if (e.caller_frame) {
      // Frames below the allocating one that are still listed have returned.
      while (!calls.calls.empty() && calls.calls.back().frame < e.caller_frame) calls.calls.pop_back();
      if (calls.calls.empty() || calls.calls.back().frame != e.caller_frame)
        calls.calls.push_back({e.caller_frame, ++calls.next_seq ? calls.next_seq : ++calls.next_seq});
      b->call_index = (uint32_t)calls.calls.size() - 1;
      b->call_seq = calls.calls.back().seq;
    }
    if (record_events_) log_.push_back({e.ts, e.ptr, e.size, e.stack, e.tid, e.op, 0, {}});
    last_alloc_[e.tid & (kLastAllocSlots - 1)] = LastAlloc{e.tid, e.ptr};
    size_hist_[size_t(e.stack) * kBuckets + log2_bucket(e.size)]++;
    Site& s = sites_[e.stack];
    s.alloc_count++;
    s.alloc_bytes += e.size;
    add_estimate(s.est_alloc_count, s.est_alloc_bytes, e.size);
    s.out_count++;
    s.out_bytes += e.size;
    s.op_mask |= uint64_t(1) << e.op;
  }

  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
  Control* ctl_ = nullptr;
  std::vector<RingState> rings_;
  uint64_t last_ts_ = 0, prev_drain_ts_ = 0;
  static constexpr uint64_t kStuckNs = 2000000000;
  static constexpr size_t kDrainAgain = 16384;  // events in one drain: no sleep before the next
  double sample_rate_ = 0;  // bytes; 0: every call traced
  std::vector<std::pair<size_t, uint32_t>> stacks_;  // (offset into frames_, count)
  std::vector<uint32_t> stack_next_;                // next stack id with the same hash
  std::vector<uint64_t> stack_offsets_;
  std::vector<uint64_t> frames_;
  std::unordered_map<uint64_t, uint32_t> by_hash_;
  static constexpr size_t kRecent = 4096;
  std::vector<std::pair<uint64_t, uint32_t>> recent_ =
      std::vector<std::pair<uint64_t, uint32_t>>(kRecent, {0, 0});
  std::vector<Site> sites_;
  LiveMap live_;
  uint64_t unknown_frees_ = 0, replaced_live_ = 0, applied_ = 0, busy_ns_ = 0, parsed_ = 0;
  uint64_t unordered_ = 0;  // dependencies given up
  uint64_t clock0_ = 0, ns0_ = 0;
  struct ThreadPair {
    uint32_t stack, alloc_tid, free_tid;
    bool operator==(const ThreadPair& o) const {
      return stack == o.stack && alloc_tid == o.alloc_tid && free_tid == o.free_tid;
    }
  };
  struct ThreadPairHash {
    size_t operator()(const ThreadPair& p) const {
      return std::hash<uint64_t>()((uint64_t(p.stack) << 40) ^ (uint64_t(p.alloc_tid) << 20) ^
                                   p.free_tid);
    }
  };
  std::vector<uint64_t> size_hist_, life_hist_;  // kBuckets per stack
  // Per thread, its latest allocation (direct-mapped by tid; a collision only forgets one).
  static constexpr size_t kLastAllocSlots = 4096;
  struct LastAlloc {
    uint32_t tid;
    uint64_t ptr;
  };
  std::vector<LastAlloc> last_alloc_ = std::vector<LastAlloc>(kLastAllocSlots, LastAlloc{0, 0});
  std::vector<ThreadCalls> thread_calls_ = std::vector<ThreadCalls>(kLastAllocSlots);
  std::unordered_map<ThreadPair, uint64_t, ThreadPairHash> thread_pairs_;
  double ns_per_tick_ = 1.0;
  mutable std::mutex mutex_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  bool released_ = false;
  bool record_events_ = false;
  std::vector<LoggedEvent> log_;
  Dropped dropped_at_release_;
};

// Size and fill a new segment file (created by Python with O_EXCL, owner-only).
void format_segment(int fd, uint32_t nrings, uint32_t ring_bytes, uint32_t depth, uint32_t clock,
                    uint64_t min_size, uint64_t max_size, uint64_t pid,
                    const std::unordered_map<int, uint64_t>& real,
                    const std::vector<uint64_t>& known, double abandon_after_s,
                    uint64_t sample_rate, bool no_avx512) {
  if (nrings == 0 || nrings > kMaxRings)
    throw std::invalid_argument("rings must be between 1 and " + std::to_string(kMaxRings));
  if (ring_bytes < 4096 || (ring_bytes & (ring_bytes - 1)) != 0)
    throw std::invalid_argument("ring size must be a power of two of at least 4096 bytes");
  if (depth < 1 || depth > (uint32_t)kMaxDepth)
    throw std::invalid_argument("depth must be between 1 and " + std::to_string(kMaxDepth));
  size_t bytes = segment_bytes(nrings, ring_bytes, depth);
  if (ftruncate(fd, (off_t)bytes) != 0) throw std::runtime_error("cannot size segment");
  void* m = mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) throw std::runtime_error("cannot map segment");
  Control* c = (Control*)m;
  std::memset((void*)c, 0, sizeof(Control));
  c->version = kVersion;
  c->control_bytes = sizeof(Control);
  c->nrings = nrings;
  c->ring_bytes = ring_bytes;
  c->depth = depth;
  c->clock = clock;
  c->min_size = min_size;
  c->max_size = max_size;
  c->sample_rate = sample_rate;
  c->no_avx512 = no_avx512;
  c->target_pid = pid;
  c->heartbeat_ns = monotonic_ns();  // the pulse starts now: memhook dying before attach counts
  c->abandon_after_ns = (uint64_t)(abandon_after_s * 1e9);
  for (auto& [id, addr] : real)
    if (id > 0 && id < kMaxHooks) c->real[id] = addr;
  c->nknown = (uint32_t)std::min<size_t>(known.size(), kMaxKnownObjects);
  for (uint32_t i = 0; i < c->nknown; i++) c->known_bases[i] = known[i];
  __atomic_store_n(&c->magic, kMagic, __ATOMIC_RELEASE);
  munmap(m, sizeof(Control));
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "memhook native consumer: shared segment, ring draining, per-stack aggregation";
  m.def("hooks", [] {
    std::vector<py::tuple> out;
    for (const HookInfo& h : kHooks)
      out.push_back(py::make_tuple(h.id, h.symbol, h.name, std::string(1, h.kind)));
    return out;
  });
  m.def("format_segment", &format_segment, py::arg("fd"), py::arg("nrings"),
        py::arg("ring_bytes"), py::arg("depth"), py::arg("clock"), py::arg("min_size"),
        py::arg("max_size"), py::arg("pid"), py::arg("real"), py::arg("known"),
        py::arg("abandon_after_s"), py::arg("sample_rate") = 0,
        py::arg("no_avx512") = false);
  m.attr("MAX_DEPTH") = kMaxDepth;
  m.attr("MAX_RINGS") = kMaxRings;
  m.attr("HISTOGRAM_BUCKETS") = kBuckets;
  // Where memhook's detach script finds the late-patched slots in the target's copy.
  m.attr("CONTROL_NLATE_OFFSET") = offsetof(Control, nlate);
  m.attr("CONTROL_LATE_OFFSET") = offsetof(Control, late);
  m.attr("CONTROL_NSLOTS_OFFSET") = offsetof(Control, nslots);
  m.attr("CONTROL_SLOTS_OFFSET") = offsetof(Control, slots);
  m.attr("CONTROL_HEARTBEAT_OFFSET") = offsetof(Control, heartbeat_ns);
  m.attr("SLOT_BYTES") = sizeof(PatchedSlot);
  m.attr("MAX_SLOTS") = kMaxSlots;
  m.attr("MAX_LATE_SLOTS") = kMaxLateSlots;
  m.attr("LOGGED_EVENT_BYTES") = sizeof(LoggedEvent);
  m.attr("CLOCK_TSC") = (int)kClockTsc;
  m.attr("MODE_OFF") = (int)kOff;
  m.attr("CLOCK_MONOTONIC") = (int)kClockMonotonic;
  py::class_<Consumer>(m, "Consumer")
      .def(py::init<int>(), py::arg("segment_fd"))
      .def("drain", &Consumer::drain, py::arg("final") = false,
           py::call_guard<py::gil_scoped_release>())
      .def("start", &Consumer::start, py::arg("busy_us") = 1000, py::arg("idle_us") = 10000)
      .def("stop", &Consumer::stop, py::call_guard<py::gil_scoped_release>())
      .def("totals", &Consumer::totals)
      .def("sites", &Consumer::sites)
      .def("stacks", &Consumer::stacks, py::arg("since") = 0)
      .def("record_events", &Consumer::record_events)
      .def("live_blocks", &Consumer::live_blocks)
      .def("behaviour", &Consumer::behaviour)
      .def("take_events", &Consumer::take_events)
      .def("late_slots", &Consumer::late_slots)
      .def("any_busy", &Consumer::any_busy)
      .def("release_rings", &Consumer::release_rings, py::call_guard<py::gil_scoped_release>())
      .def("ticks_to_ns", &Consumer::ticks_to_ns)
      .def_property_readonly("clock_origin", [](const Consumer& c) { return c.clock_origin(); })
      .def_property_readonly("started", &Consumer::started)
      .def_property_readonly("abandoned", &Consumer::abandoned)
      .def_property_readonly("lib_base", &Consumer::lib_base);
}
