// What the consumer keeps per call stack as events are applied: allocation, free and
// outstanding counts and bytes (sampling mode: their estimates), who freed, lifetimes and
// sizes, and the live blocks themselves.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <unordered_map>
#include <vector>

#include "census_blocks.h"
#include "grown_array.h"
#include "live_map.h"
#include "operations.h"
#include "sparse_histograms.h"

namespace memhook {

// One event as applied, from the ring's record (ring_reader.h).
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
  uint64_t uncertainty = 0;  // how far `ts` may be off (ticks): ring_reader.h, time_of()
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
  uint64_t op_mask = 0;
  // Behaviour: who freed (the allocating thread or another), and heaptrack's "temporary":
  // freed before its thread allocated anything else.
  uint64_t freed_same_thread = 0, freed_other_thread = 0, temporary = 0;
  uint64_t freed_same_call = 0;  // freed while the allocating call was still active
  // Outstanding blocks that may have been freed: their frees may have been dropped, and the
  // address table could not tell (Aggregates::reconcile).
  uint64_t uncertain_count = 0, uncertain_bytes = 0;
  // Sampling mode: each sampled block stands for 1/P blocks (P its chance of being sampled).
  double est_alloc_count = 0, est_alloc_bytes = 0, est_free_count = 0, est_free_bytes = 0;
  double est_uncertain_count = 0, est_uncertain_bytes = 0;
  // Its outstanding bytes at the session's latest peak, kept the first time it changes after
  // that peak (peak_epoch says which peak); one that has not changed since holds them still.
  double peak_out = 0;
  uint32_t peak_epoch = 0;
};

// What a site reports: its counts, outstanding = allocated - freed (estimated from the samples
// in sampling mode, exact otherwise). Derived when asked, never stored beside what it comes from.
struct Counts {
  uint64_t alloc_count, alloc_bytes, free_count, free_bytes, out_count, out_bytes, op_mask;
  uint64_t uncertain_count, uncertain_bytes;
};

// What the address table says of a live block's pointer (reconcile).
enum class TableSays { kLive, kFreed, kUnknown };

// Reports claim lifetimes to this resolution at best (README, "Lifetimes"): one shorter, however
// well timed, is counted as "under 1 µs".
constexpr uint64_t kLifetimeResolutionNs = 1024;
inline int log2_bucket(uint64_t v) { return v ? std::min(63 - __builtin_clzll(v), kBuckets - 1) : 0; }

class Aggregates {
 public:
  struct ThreadPair {
    uint32_t stack, alloc_tid, free_tid;
    bool operator==(const ThreadPair& o) const {
      return stack == o.stack && alloc_tid == o.alloc_tid && free_tid == o.free_tid;
    }
  };

  // sample_rate: bytes (sampling mode), 0 when every call is traced.
  explicit Aggregates(double sample_rate) : sample_rate_(sample_rate) { grow(1); }

  // Rows for stack ids below `stacks`.
  void grow(size_t stacks) {
    if (stacks <= sites_.size()) return;
    sites_.resize(stacks);
    size_hist_.resize(stacks);
    life_hist_.resize(stacks);
    unresolved_hist_.resize(stacks);
  }

  __attribute__((always_inline)) void apply(const Event& e, double ns_per_tick) {
    // The hooks never record a null pointer; a forged record may (the live map's empty key).
    if (__builtin_expect(!e.ptr, 0)) return;
    ThreadCalls& calls = calls_of(e.tid, e.hook_frame);
    if (e.is_free) {
      LiveMap::Block* b = live_.find(e.ptr);
      if (!b) {
        unknown_frees_++;
        if (census_ && census_->freed(e.ptr)) census_frees_++;
        return;
      }
      if (record_events_) log_.push_back({e.ts, e.ptr, b->size, b->stack, e.tid, e.op, 1, {}});
      Site& s = sites_[b->stack];
      count_free(s, b->size);
      if (b->tid == e.tid) {
        s.freed_same_thread++;
        if (b->call_seq && b->call_index < calls.calls.size() &&
            calls.calls[b->call_index].seq == b->call_seq)
          s.freed_same_call++;
      } else {
        s.freed_other_thread++;
        thread_pairs_[ThreadPair{b->stack, b->tid, e.tid}]++;  // rare: only these are mapped
      }
      LastAlloc& last = last_alloc_[e.tid & (kPerThread - 1)];
      if (last.tid == e.tid && last.ptr == e.ptr) s.temporary++;
      last.ptr = 0;
      // The lifetime, where both events' uncertainties together (the idle time their windows
      // may hide) are at most a third of it, all it may be lies in one bucket, and it is no
      // shorter than the resolution reports claim; any other is known only to lie under a
      // bound. (A lifetime near a bucket's edge, or stretched across it by a stall the target
      // measured itself, was put in the bucket of its estimate: test_lifetimes.py's busy
      // thread, 1 run in 12 beside two CPU hogs.)
      const uint64_t life = e.ts > b->ts ? e.ts - b->ts : 0, unc = e.uncertainty + b->uncertainty;
      const uint64_t life_ns = uint64_t(double(life) * ns_per_tick);
      const uint64_t least_ns = uint64_t(double(life - std::min(life, unc)) * ns_per_tick);
      const uint64_t most_ns = uint64_t(double(life + unc) * ns_per_tick);
      if (life >= 3 * unc && least_ns >= kLifetimeResolutionNs &&
          log2_bucket(least_ns) == log2_bucket(most_ns))
        life_hist_.add(b->stack, log2_bucket(life_ns));
      else
        unresolved_hist_.add(b->stack, log2_bucket(std::max<uint64_t>(
                                           uint64_t(double(life + unc) * ns_per_tick),
                                           kLifetimeResolutionNs - 1)));
      live_.erase(b);
      return;
    }
    bool inserted;
    LiveMap::Block* b = live_.insert(e.ptr, &inserted);
    if (!inserted) {
      // The block's free was lost (dropped): it cannot still be outstanding. (The allocation
      // depends on the block's own, through the address table, so it comes after it.)
      count_free(sites_[b->stack], b->size);
      replaced_live_++;
    }
    b->stack = e.stack;
    b->size = e.size;
    b->ts = e.ts;
    b->uncertainty = e.uncertainty;
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
    last_alloc_[e.tid & (kPerThread - 1)] = LastAlloc{e.tid, e.ptr};
    size_hist_.add(e.stack, log2_bucket(e.size));
    Site& s = sites_[e.stack];
    keep_peak(s);
    s.alloc_count++;
    s.alloc_bytes += e.size;
    add_estimate(s.est_alloc_count, s.est_alloc_bytes, e.size);
    s.op_mask |= operation_bit(e.op);
    out_total_ += weight(e.size);
    if (out_total_ > peak_total_) {  // a new peak: every site's value now is its value at it
      peak_total_ = out_total_;
      peak_ts_ = e.ts;
      peak_epoch_++;
    }
  }

  // The session's highest outstanding bytes (estimated in sampling mode), when (raw clock),
  // and a site's outstanding bytes at that moment.
  double peak_total() const { return peak_total_; }
  uint64_t peak_ts() const { return peak_ts_; }
  double peak_of(const Site& s) const {
    return s.peak_epoch == peak_epoch_ ? s.peak_out : outstanding(s);
  }

  // After the last event, when frees were dropped: `says(ptr)` is what the target's address table
  // holds for each live block. A block whose entry says freed was freed without a record: it is
  // applied as a free (no lifetime: when is unknown). One whose entry another pointer has taken
  // since cannot be told apart from a block still live: it stays outstanding, counted as
  // uncertain on its stack.
  template <class F>
  void reconcile(F says) {
    std::vector<uint64_t> freed;
    for (const LiveMap::Block& b : live_.entries()) {
      if (!b.key) continue;
      const TableSays s = says(b.key);
      if (s == TableSays::kFreed) {
        freed.push_back(b.key);
      } else if (s == TableSays::kUnknown) {
        Site& site = sites_[b.stack];
        site.uncertain_count++;
        site.uncertain_bytes += b.size;
        add_estimate(site.est_uncertain_count, site.est_uncertain_bytes, b.size);
      }
    }
    for (uint64_t p : freed) {
      LiveMap::Block* b = live_.find(p);
      count_free(sites_[b->stack], b->size);
      live_.erase(b);
    }
    reconciled_frees_ += freed.size();
  }

  // A site's counts, estimated from the samples in sampling mode (exact otherwise).
  Counts counts(const Site& s) const {
    if (sample_rate_ <= 0)
      return {s.alloc_count, s.alloc_bytes, s.free_count, s.free_bytes,
              s.alloc_count - s.free_count, s.alloc_bytes - s.free_bytes, s.op_mask,
              s.uncertain_count, s.uncertain_bytes};
    auto whole = [](double v) { return v > 0 ? (uint64_t)std::llround(v) : uint64_t(0); };
    return {whole(s.est_alloc_count), whole(s.est_alloc_bytes), whole(s.est_free_count),
            whole(s.est_free_bytes), whole(s.est_alloc_count - s.est_free_count),
            whole(s.est_alloc_bytes - s.est_free_bytes), s.op_mask,
            whole(s.est_uncertain_count), whole(s.est_uncertain_bytes)};
  }

  const GrownArray<Site>& sites() const { return sites_; }  // by stack id
  const LiveMap& live() const { return live_; }
  const SparseHistograms& size_hist() const { return size_hist_; }  // by stack id
  const SparseHistograms& life_hist() const { return life_hist_; }
  // Lifetimes known only to lie below a bound: bucket b counts those under 2^(b+1) ns.
  const SparseHistograms& unresolved_hist() const { return unresolved_hist_; }
  template <class F>
  void each_thread_pair(F f) const {
    for (const auto& [k, count] : thread_pairs_) f(k, count);
  }
  uint64_t unknown_frees() const { return unknown_frees_; }
  // The census's blocks (census/census_blocks.h): unknown frees are matched to them.
  void match_census(std::shared_ptr<census::CensusBlocks> blocks) { census_ = std::move(blocks); }
  const census::CensusBlocks* census() const { return census_.get(); }
  uint64_t census_frees() const { return census_frees_; }
  uint64_t replaced_live() const { return replaced_live_; }
  uint64_t reconciled_frees() const { return reconciled_frees_; }
  double sample_rate() const { return sample_rate_; }

  void record_events(bool on) { record_events_ = on; }
  std::vector<LoggedEvent> take_events() {
    std::vector<LoggedEvent> out;
    out.swap(log_);
    return out;
  }

 private:
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
  // Per thread, its latest allocation (direct-mapped by tid; a collision only forgets one).
  struct LastAlloc {
    uint32_t tid;
    uint64_t ptr;
  };
  struct ThreadPairHash {
    size_t operator()(const ThreadPair& p) const {
      return std::hash<uint64_t>()((uint64_t(p.stack) << 40) ^ (uint64_t(p.alloc_tid) << 20) ^
                                   p.free_tid);
    }
  };
  static constexpr size_t kPerThread = 4096;  // direct-mapped per-thread tables

  ThreadCalls& calls_of(uint32_t tid, uint64_t hook_frame) {
    ThreadCalls& c = thread_calls_[tid & (kPerThread - 1)];
    if (c.tid != tid) {  // first sight of the thread (or a collision): start afresh
      c.tid = tid;
      c.calls.clear();
    }
    while (hook_frame && !c.calls.empty() && c.calls.back().frame <= hook_frame) c.calls.pop_back();
    return c;
  }

  void count_free(Site& s, uint64_t size) {
    keep_peak(s);
    s.free_count++;
    s.free_bytes += size;
    add_estimate(s.est_free_count, s.est_free_bytes, size);
    out_total_ -= weight(size);
  }

  // The peak without keeping events (each site's value at it kept lazily): O(1) an event.
  double outstanding(const Site& s) const {
    return sample_rate_ > 0 ? s.est_alloc_bytes - s.est_free_bytes
                            : double(s.alloc_bytes) - double(s.free_bytes);
  }
  double weight(uint64_t size) const {
    return sample_rate_ > 0 ? double(size) / -std::expm1(-double(size) / sample_rate_)
                            : double(size);
  }
  void keep_peak(Site& s) {
    if (s.peak_epoch != peak_epoch_) {
      s.peak_out = outstanding(s);
      s.peak_epoch = peak_epoch_;
    }
  }

  // Sampling mode: a sampled block of `size` stands for 1 / P(sampled) blocks in the estimates
  // (unused, and not kept, when every call is traced).
  void add_estimate(double& count, double& bytes, uint64_t size) const {
    if (sample_rate_ <= 0) return;
    const double w = 1.0 / -std::expm1(-double(size) / sample_rate_);
    count += w;
    bytes += w * double(size);
  }

  double sample_rate_;
  // (each stack's, grown with the stack table: grown_array.h)
  GrownArray<Site> sites_;
  SparseHistograms size_hist_, life_hist_, unresolved_hist_;
  LiveMap live_;
  uint64_t unknown_frees_ = 0, replaced_live_ = 0, reconciled_frees_ = 0, census_frees_ = 0;
  double out_total_ = 0, peak_total_ = 0;  // outstanding bytes now, and at the peak
  uint64_t peak_ts_ = 0;
  uint32_t peak_epoch_ = 0;  // which peak the sites' kept values belong to
  std::shared_ptr<census::CensusBlocks> census_;
  std::vector<LastAlloc> last_alloc_ = std::vector<LastAlloc>(kPerThread, LastAlloc{0, 0});
  std::vector<ThreadCalls> thread_calls_ = std::vector<ThreadCalls>(kPerThread);
  std::unordered_map<ThreadPair, uint64_t, ThreadPairHash> thread_pairs_;
  bool record_events_ = false;
  std::vector<LoggedEvent> log_;
};

}  // namespace memhook
