// Applying the per-thread rings into the stack table and the aggregates, which it owns (held
// in place, not through references: the drain loop reads them for every event).
//
// Applying the per-thread rings. Each ring is applied in order, in place; an event that depends
// on another ring's event (segment.h: a pointer freed on one thread and reused on another) waits
// until that ring has applied it, and its ring waits with it. Dependencies follow the allocator's
// own happens-before order, so they never form a cycle; one whose event will never come (its
// writer died inside a hook) is given up after kStuckNs, and the final drain after detach gives
// up whatever is left. Time: each ring's latest clock record, never earlier than the previous
// drain (an event seen now was published after the last look), monotonic in apply order.
//
// Ring contents are hostile (the target's user can write them): nothing is read outside a
// ring, and a malformed record ends what is read of the ring this time.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "aggregates.h"
#include "clock.h"
#include "segment.h"
#include "stack_table.h"

namespace memhook {

class RingReader {
 public:
  // `segment`: the mapped segment, its control block already checked; start_ts: the clock when
  // the consumer began (no event is earlier).
  RingReader(uint8_t* segment, uint64_t start_ts)
      : base_(segment), ctl_((const Control*)segment), rings_(ctl_->nrings),
        aggregates_(double(ctl_->sample_rate)), prev_drain_ts_(start_ts) {}

  // Apply every ring's published events that are ordered (the final drain: all of them).
  // drain_ts: the clock now, which later drains' events are never earlier than. Returns events.
  size_t drain(bool final, uint64_t drain_ts, double ns_per_tick) {
    ns_per_tick_ = ns_per_tick;
    drain_ts_ = drain_ts;
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

  RingHeader* ring(uint32_t i) const {
    return (RingHeader*)(base_ + rings_offset() + size_t(i) * ring_stride(ctl_->ring_bytes));
  }
  uint64_t applied() const { return applied_; }
  const StackTable& stacks() const { return stacks_; }
  Aggregates& aggregates() { return aggregates_; }
  const Aggregates& aggregates() const { return aggregates_; }
  uint64_t unordered() const { return unordered_; }  // dependencies given up

 private:
  static constexpr uint64_t kStuckNs = 2000000000;
  static constexpr uint64_t kPaceBytes = 1024;  // windows shorter than this set no pace
  static constexpr uint32_t kPaces = 32;        // recent windows' paces kept per ring
  static constexpr uint32_t kMinPaces = 8;      // fewer: no pace known, every window uncertain

  struct RingState {
    uint64_t read = 0;     // cursor past the last event applied
    uint64_t seen_write = 0;  // the writer's cursor at the previous look
    // Time: the latest anchor at or before `read` (a clock record, or the writer's cursor as a
    // drain found it, with the consumer's clock right after), and the writer's busy pace
    // (bytes per tick: the fastest of its recent windows of 1 KiB or more, once there are a
    // few; a slower one would take a window the thread partly slept through for a busy one),
    // which tells how much of a window it may have been idle.
    uint64_t anchor_w = 0, anchor_t = 0;
    uint64_t snap_w = 0, snap_t = 0;  // the previous drain's look at the write cursor, if ahead
    bool anchored = false;
    double peak_rate = 0;
    float paces[kPaces] = {};
    uint32_t npaces = 0;
    uint32_t tid = 0;      // its writer (kThread records)
    bool blocked = false;  // its next event waits for another ring
    bool force = false;    // apply the next event without waiting
    uint64_t blocked_at = UINT64_MAX, blocked_since = 0;  // cursor it waits at, since when
    struct Held {
      uint64_t depth;  // its depth bits (a pointer word's), from the record that filled it
      uint32_t stack;
    } recent[kRecentStacks] = {};  // the stack each of the writer's recent stacks holds
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
                    uint32_t index) const {
    if (kind == kFree || (kind == kRealloc && ((at[3] ^ at[1]) & kPtrMask) == 0)) return false;
    const LiveMap::Block* b = aggregates_.live().find(at[1] & kPtrMask);
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

  // An anchor: every event before cursor `w` happened no later than `t`, every event after it
  // no earlier (a clock record the writer wrote at w; or w as a drain found the write cursor,
  // and the consumer's clock read just after).
  struct Anchor {
    uint64_t w, t;
  };

  // The clock records in what the writer published from `rd` to `w`, in order, then (w, now):
  // the anchors the events between them are timed by. Headers only; what apply_ring() finds
  // malformed it skips, so this one stops there too.
  void find_anchors(const RingState& rs, const uint8_t* data, uint64_t rd, uint64_t w,
                    uint64_t now) {
    const uint64_t cap = ctl_->ring_bytes;
    const uint64_t from = rd;
    anchors_.clear();
    while (rd != w && w - rd <= cap) {
      RecordAt r;
      const Next next = next_record(data, cap, rd, w - rd, &r);
      if (next == Next::kMalformed) break;
      if (next == Next::kRecord && r.h.kind == kTime) anchors_.push_back({rd, r.at[1]});
      rd += r.bytes;
    }
    if (rs.snap_t && rs.snap_w - from - 1 < w - from - 1) {  // strictly between: in cursor order
      const Anchor snap{rs.snap_w, rs.snap_t};
      anchors_.insert(std::upper_bound(anchors_.begin(), anchors_.end(), snap,
                                       [](const Anchor& x, const Anchor& y) { return x.w < y.w; }),
                      snap);
    }
    anchors_.push_back({w, now});
  }

  // When the event at cursor `c` happened, between the anchors around it (in proportion to its
  // place among the bytes the writer wrote between them), and how much of that window the
  // writer may have spent idle: the time it would not have needed at its fastest seen pace.
  // An event in a busy window is timed to a small fraction of it; one in a window its thread
  // mostly slept through, only to the window.
  void time_of(RingState& rs, uint64_t c, uint64_t* ts, uint64_t* uncertainty) {
    if (next_anchor_ < anchors_.size() && anchors_[next_anchor_].w <= c) {
      do {
        advance(rs, anchors_[next_anchor_]);
        next_anchor_++;
      } while (next_anchor_ < anchors_.size() && anchors_[next_anchor_].w <= c);
      window_ready_ = false;
    }
    if (!window_ready_) window(rs);
    *ts = rs.anchor_t + uint64_t(double(c - rs.anchor_w) * window_scale_);
    *uncertainty = window_uncertainty_;
  }

  // The window the next events lie in, from the latest anchor to the next: ticks per byte
  // and its possible idle time, once per window rather than per event.
  void window(const RingState& rs) {
    const Anchor& b = anchors_[std::min(next_anchor_, anchors_.size() - 1)];
    const uint64_t bt = std::max(b.t, rs.anchor_t);
    const uint64_t span_t = bt - rs.anchor_t, span_w = b.w > rs.anchor_w ? b.w - rs.anchor_w : 0;
    window_scale_ = span_w ? double(span_t) / double(span_w) : 0.0;
    const double busy = span_w && rs.peak_rate > 0 ? double(span_w) / rs.peak_rate : 0.0;
    window_uncertainty_ = busy < double(span_t) ? uint64_t(double(span_t) - busy) : 0;
    window_ready_ = true;
  }

  // Past anchor `a`: the window that ended there tells the writer's pace.
  void advance(RingState& rs, const Anchor& a) {
    const uint64_t t = std::max(a.t, rs.anchor_t);
    if (rs.anchored && a.w > rs.anchor_w && t > rs.anchor_t && a.w - rs.anchor_w >= kPaceBytes) {
      rs.paces[rs.npaces++ % kPaces] = float(double(a.w - rs.anchor_w) / double(t - rs.anchor_t));
      const uint32_t n = std::min<uint32_t>(rs.npaces, kPaces);
      rs.peak_rate = n < kMinPaces ? 0 : *std::max_element(rs.paces, rs.paces + n);
    }
    rs.anchor_w = a.w;
    rs.anchor_t = t;
    rs.anchored = true;
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
    if (!rs.anchored) {  // the ring's first events: the consumer began no later than them
      rs.anchor_w = rd;
      rs.anchor_t = prev_drain_ts_;
      rs.anchored = true;
    }
    if (w == rd) {
      // Nothing new: whatever the writer writes next comes after this look, so after the
      // drain began (a quiet thread's next window starts here, not at its last record).
      if (rs.anchor_w == w && !rs.snap_t) rs.anchor_t = std::max(rs.anchor_t, drain_ts_);
      return 0;
    }
    const uint64_t now = read_clock(ctl_->clock);  // after the cursor: an upper bound for it
    if (rs.anchor_w > rd || rd - rs.anchor_w > cap) rs.anchor_w = rd;  // forged cursors
    find_anchors(rs, data, rd, w, now);
    next_anchor_ = 0;
    window_ready_ = false;
    // While the writer is moving, leave the cache line it is filling alone: reading it would
    // take the line away from the writer's core in the middle of its records.
    const uint64_t limit = (w == rs.seen_write || final) ? w : w & ~uint64_t(63);
    rs.seen_write = w;
    size_t n = 0;
    rs.blocked = false;
    rs.read = rd;
    // Distances, not comparisons of cursors: a forged cursor near 2^64 would wrap past `limit`.
    while (rd != limit && limit - rd <= cap) {
      RecordAt rec;
      const Next next = next_record(data, cap, rd, w - rd, &rec);
      if (next == Next::kPadding) {
        rd += rec.bytes;
        continue;
      }
      if (next == Next::kMalformed) {
        rd = w;  // malformed: skip what is there
        break;
      }
      const uint64_t* const at = rec.at;
      const uint8_t kind = rec.h.kind, op = rec.h.op;
      const uint32_t nf = rec.h.nframes;
      const uint64_t aux = rec.h.aux;
      const size_t words = rec.bytes / 8;
      if (8 * words > limit - rd) break;  // ends in the line being written: next time
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
      if (kind == kTime) continue;  // an anchor (find_anchors)
      if (kind == kThread) {
        rs.tid = (uint32_t)aux;
        rs.peak_rate = 0;  // another thread's pace
        rs.npaces = 0;
        continue;
      }
      n++;
      uint64_t ts, unc;
      time_of(rs, rd - 8 * words, &ts, &unc);
      const uint64_t ptr = at[1] & kPtrMask;
      // An allocation's recent stack: one with frames fills it, one without repeats it.
      const uint32_t recent = kind == kFree ? 0 : uint32_t(at[2] >> kRecentShift);  // 1 + it, or 0
      RingState::Held* const held =
          recent && recent <= kRecentStacks ? &rs.recent[recent - 1] : nullptr;
      if (held && nf) held->depth = at[1] & ~kPtrMask;
      const uint64_t frame = pseudo_frame(held && !nf ? held->depth : at[1]);
      if (kind == kFree) {
        aggregates_.apply({ts, ptr, 0, frame, 0, 0, rs.tid, op, 1, 0, unc}, ns_per_tick_);
      } else if (kind == kAlloc || kind == kRealloc) {
        // The allocating call's frame bounds the hook's from above: frames below it returned.
        const uint64_t below = frame ? frame - 1 : 0;
        if (kind == kRealloc)
          aggregates_.apply({ts, at[3] & kPtrMask, 0, below, 0, 0, rs.tid, op, 1, 0, unc},
                            ns_per_tick_);
        uint32_t stack;
        if (nf == 0) {  // the recent stack (a walk yields at least the call site)
          stack = held ? held->stack : 0;
        } else {
          stack = stacks_.intern(at + (kind == kAlloc ? 3 : 5), nf);
          aggregates_.grow(stacks_.size());
          if (held) held->stack = stack;
        }
        aggregates_.apply(
            {ts, ptr, at[2] & kSizeMask, below, frame, stack, rs.tid, op, 0, event, unc},
            ns_per_tick_);
      }
      rs.read = rd;  // satisfied() looks here
    }
    __atomic_store_n(&r->read, rd, __ATOMIC_RELEASE);
    // What comes after w was written after `now`: the next drain's first anchor.
    if (rd == w) {
      advance(rs, {w, now});
      rs.snap_t = 0;
    } else {
      rs.snap_w = w;
      rs.snap_t = now;
    }
    return n;
  }

  uint8_t* base_;
  const Control* ctl_;
  std::vector<RingState> rings_;
  StackTable stacks_;
  Aggregates aggregates_;
  uint64_t prev_drain_ts_, drain_ts_ = 0, applied_ = 0, unordered_ = 0;
  std::vector<Anchor> anchors_;  // apply_ring()'s, for the ring it is applying
  size_t next_anchor_ = 0;
  bool window_ready_ = false;  // window_scale_ and window_uncertainty_ hold for next_anchor_
  double window_scale_ = 0;
  uint64_t window_uncertainty_ = 0;
  double ns_per_tick_ = 1.0;
};

}  // namespace memhook
