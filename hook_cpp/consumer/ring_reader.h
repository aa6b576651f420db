// Applying the per-thread rings into the stack table and the aggregates, which it owns (held
// in place, not through references: the drain loop reads them for every event).
//
// Applying the per-thread rings. Each ring is applied in order, in place; an event that depends
// on another ring's event (segment.h: a pointer freed on one thread and reused on another) waits
// until that ring has applied it, and its ring waits with it. Dependencies follow the allocator's
// own happens-before order, so they never form a cycle; one whose event will never come (its
// writer died inside a hook) is given up after kStuckNs, and the final drain after detach gives
// up whatever is left. When each event happened: event_times.h.
//
// Ring contents are hostile (the target's user can write them): nothing is read outside a
// ring, and a malformed record ends what is read of the ring this time.
#pragma once
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "aggregates.h"
#include "clock.h"
#include "event_times.h"
#include "mappings.h"
#include "operations.h"
#include "segment.h"
#include "stack_table.h"

namespace memhook {

class RingReader {
 public:
  // `segment`: the mapped segment, its control block already checked; start_ts: the clock when
  // the consumer began (no event is earlier).
  RingReader(uint8_t* segment, uint64_t start_ts)
      : base_(segment), ctl_((const Control*)segment), rings_(ctl_->nrings),
        aggregates_(double(ctl_->sample_rate)), prev_look_ts_(start_ts) {}

  // Apply every ring's published events that are ordered (the final drain: all of them).
  // drain_ts: the clock now, which later drains' events are never earlier than. `whole`: up to
  // each write cursor, the cache line a writer is filling included (what was published until
  // now, for a snapshot). Returns events.
  size_t drain(bool final, uint64_t drain_ts, double ns_per_tick, bool whole = false) {
    ns_per_tick_ = ns_per_tick;
    drain_ts_ = drain_ts;
    size_t total = 0, passes = 0;
    const uint64_t started = monotonic_ns();
    for (;;) {
      size_t n = 0;
      bool blocked = false;
      for (uint32_t i = 0; i < ctl_->nrings; i++) n += apply_ring(i, final, whole, &blocked);
      total += n;
      if (!blocked) break;  // every ring applied as far as published (or as far as ordered)
      // What was applied may unblock a ring: go round again. A running drain at most 64
      // times (the next drain goes on); the final one while rings move, for up to kStuckNs
      // (a pass may apply one event of a long chain between rings: 400 threads' churn once
      // took minutes), or what is left would be lost.
      if (!final) {
        if (n && ++passes < 64) continue;
        break;
      }
      if (n && monotonic_ns() - started < kStuckNs) continue;
      // The final drain, too slow: what is left is applied in each ring's order without
      // waiting on the others (counted as unordered). No ring moving: give up a dependency
      // (the oldest-numbered blocked ring's), since nothing more will be published.
      if (n) unordered_final_ = true;
      for (uint32_t i = 0; i < ctl_->nrings; i++)
        if (rings_[i].blocked) {
          rings_[i].force = true;
          break;
        }
    }
    prev_look_ts_ = drain_ts;
    applied_ += total;
    return total;
  }

  // What a look at every ring found (look()).
  struct Look {
    bool pending = false;  // some ring holds events not applied
    bool due = false;      // apply them now: a ring filling, a writer waiting for room
  };
  // Events are applied when a ring holds a quarter of its bytes, when a writer waits for
  // room, or at the latest kDrainEveryNs after they arrived (consumer.h), not at every look: a
  // short program's events wait in the rings while it runs (the rings hold them; its 400
  // threads' 800,000 events are 18 MB in 256 MiB of rings), and the consumer's work, 45 ms of a
  // core on two cores, comes after it instead of beside it (benchmarks/versus_heaptrack.py).
  // Each look still notes every moving write cursor with the clock, so events are timed as
  // finely as when every look applied them (event_times.h).
  static constexpr uint64_t kDrainFromParts = 4;  // a ring's bytes / this
  static constexpr size_t kMaxLooks = 128;        // looks kept per ring before it is applied

  Look look(uint64_t look_ts, double ns_per_tick) {
    Look l;
    const uint64_t cap = ctl_->ring_bytes;
    for (uint32_t i = 0; i < ctl_->nrings; i++) {
      const RingHeader* r = ring(i);
      RingClock& c = rings_[i].clock;
      const uint64_t before = read_clock(ctl_->clock);
      const uint64_t w = __atomic_load_n(&r->write, __ATOMIC_ACQUIRE);
      const uint64_t rd = r->read;
      const uint64_t now = w == rd ? look_ts : read_clock(ctl_->clock);  // after the cursor
      rings_[i].seen_write = w;  // (apply_ring: a writer that has not moved since)
      c.first_look(rd, prev_look_ts_);
      if (w == rd) {
        c.quiet(w, now);
        continue;
      }
      l.pending = true;
      if (close(before, now, ns_per_tick)) note_look(c.looks, {w, now});
      if (w - rd >= cap / kDrainFromParts || c.looks.size() >= kMaxLooks ||
          __atomic_load_n(&r->waiting, __ATOMIC_RELAXED))
        l.due = true;
    }
    prev_look_ts_ = look_ts;
    return l;
  }

  // A look's anchor (w, t) bounds the events before w from above and those after it from
  // below, which holds as far as the clock read after the cursor follows its load closely.
  // A consumer preempted between the two (the VM's, a busy host's) would time the events after
  // w too late with no uncertainty for it. A look whose two clock reads are more than
  // kMaxGapNs apart is not noted (its window merges with the next, whose idle time grows by as
  // much), and such a drain ends with the clock read before the cursor (apply_ring).
  // test_lifetimes.py's busy thread had a lifetime in too low a bucket.
  static constexpr double kMaxGapNs = 20000;
  static bool close(uint64_t before, uint64_t after, double ns_per_tick) {
    return double(after - before) * ns_per_tick <= kMaxGapNs;
  }

  // A look at a ring with events waiting. An idle writer's first look at its cursor and its
  // latest suffice; past kMaxLooks (a ring that waits on another), the latest replaces the last.
  static void note_look(std::vector<Anchor>& looks, Anchor a) {
    const size_t n = looks.size();
    if ((n >= 2 && looks[n - 1].w == a.w && looks[n - 2].w == a.w) || n >= kMaxLooks)
      looks[n - 1] = a;
    else
      looks.push_back(a);
  }

  RingHeader* ring(uint32_t i) const {
    return (RingHeader*)(base_ + rings_offset() + size_t(i) * ring_stride(ctl_->ring_bytes));
  }
  uint64_t applied() const { return applied_; }
  const StackTable& stacks() const { return stacks_; }
  Aggregates& aggregates() { return aggregates_; }
  const Aggregates& aggregates() const { return aggregates_; }
  const Mappings& mappings() const { return mappings_; }
  uint64_t unordered() const { return unordered_; }  // dependencies given up

 private:
  static constexpr uint64_t kStuckNs = 2000000000;
  bool unordered_final_ = false;  // the final drain gave up ordering (see drain)

  struct RingState {
    uint64_t read = 0;     // cursor past the last event applied
    uint64_t seen_write = 0;  // the writer's cursor at the previous look
    RingClock clock;       // when its events happened (event_times.h)
    EventTimes::Found found;  // its clock records read so far (event_times.h)
    uint32_t tid = 0;      // its writer (kThread records)
    bool blocked = false;  // its next event waits for another ring
    bool force = false;    // apply the next event without waiting
    bool remapped = false; // its mremap's old range was a known mapping (mappings.h)
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
    uint32_t slack = 8 + 2 * kMaxRecordFrames;  // the largest record, in words
    return uint32_t(start - read) > ahead + slack;
  }

  // A block allocated while the map still holds it live from another thread: its free must be
  // published in a ring not yet applied (a free is published before the real call, an allocation
  // after it). Backs up a dependency the address table lost to a colliding pointer, or one that
  // names another pointer's event: the malloc hook sends the entry's without asking whose it is.
  // `others`: whether another ring had events not applied when this pass began (others_pending).
  bool free_pending(uint8_t kind, uint64_t dep, const uint64_t* at, const RingState& rs,
                    uint32_t index, bool others) const {
    if (!others || kind == kFree || kind == kUnmap ||
        (kind == kRealloc && ((at[3] ^ at[1]) & kPtrMask) == 0))
      return false;
    const LiveMap::Block* b = aggregates_.live().find(at[1] & kPtrMask);
    if (!b || b->tid == rs.tid) return false;
    if (dep == b->event) return false;  // its allocation was the block's latest event: free lost
    return others_pending(index);  // or nothing left to wait for: the free was lost
  }

  // Whether a ring other than `index` holds events not yet applied. Looked at once a pass, after
  // the pass read its ring's write cursor: a free that one of its allocations waits for was
  // published before that allocation (before the real free, which came before the malloc that
  // returned the block again), so it is seen here, and other rings' cursors do not move during
  // the pass (one consumer thread). Spares every allocation of a lone writer a live-map lookup.
  bool others_pending(uint32_t index) const {
    for (uint32_t j = 0; j < ctl_->nrings; j++)
      if (j != index && rings_[j].read < __atomic_load_n(&ring(j)->write, __ATOMIC_ACQUIRE))
        return true;
    return false;
  }

  // Bytes applied between two stores of a ring's read cursor within one pass: a writer waiting
  // for room goes on after this much, not after the whole ring; after kLookEvery when it is
  // waiting already (its flag is read that often: it shares the line the writer keeps
  // writing), so that a wait lasts while the consumer applies 16 KiB, not 64 (a burst of kept
  // blocks, each a live-map insert of up to 1.6 us here, came within 0.2 ms of the 10 ms bound).
  static constexpr uint64_t kPublishEvery = 64 << 10, kLookEvery = 16 << 10;

  // A writer waiting for room (--lossless: hook_library/full_ring.h) sleeps on the read
  // cursor's low word once it has set `waiting`: the fences order this store of `read` and that
  // look against its store of `waiting` and its look at `read`, so one of the two sees the other.
  static void wake_writer(RingHeader* r) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&r->waiting, __ATOMIC_RELAXED))
      syscall(SYS_futex, (uint32_t*)&r->read, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
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

  // Each event's live-map entry is a cache miss (the map is far larger than the caches, and a
  // good hash scatters neighbours): the entries of the next kPrefetchRecords records are
  // fetched while this one is applied, so that their misses overlap instead of following one
  // another. Only a hint: a record that turns out not to be an event, or a map resized
  // meanwhile, costs a wasted fetch.
  static constexpr uint32_t kPrefetchRecords = 12;
  void prefetch_ahead(const uint8_t* data, uint64_t cap, uint64_t limit, uint64_t rd,
                      uint64_t* ahead, uint32_t* in_flight) const {
    if (*ahead - rd > limit - rd) {  // behind (a padding record skipped past it)
      *ahead = rd;
      *in_flight = 0;
    }
    while (*in_flight < kPrefetchRecords && *ahead != limit) {
      RecordAt r;
      const Next next = next_record(data, cap, *ahead, limit - *ahead, &r);
      if (next == Next::kMalformed) {
        *ahead = limit;  // the loop will stop there; nothing more to fetch
        return;
      }
      if (next == Next::kRecord) {
        const uint8_t kind = r.h.kind;
        if (kind == kAlloc || kind == kFree || kind == kRealloc)
          aggregates_.live().prefetch(r.at[1] & kPtrMask);
        if (kind == kRealloc) aggregates_.live().prefetch(r.at[3] & kPtrMask);
      }
      *ahead += r.bytes;
      ++*in_flight;
    }
  }

  // Apply ring `index` in order until it is empty or waits (the final drain takes everything
  // published). Returns events applied.
  size_t apply_ring(uint32_t index, bool final, bool whole, bool* any_blocked) {
    RingHeader* r = ring(index);
    RingState& rs = rings_[index];
    const uint64_t cap = ctl_->ring_bytes;
    const uint8_t* data = (const uint8_t*)(r + 1);
    const uint64_t before = read_clock(ctl_->clock);
    const uint64_t w = __atomic_load_n(&r->write, __ATOMIC_ACQUIRE);
    uint64_t rd = r->read;
    if (w - rd > cap) rd = w - cap;  // corrupt cursor: never read outside the ring
    rs.clock.first_look(rd, prev_look_ts_);
    if (w == rd) {  // nothing new: what the writer writes next comes after the drain began
      rs.clock.quiet(w, drain_ts_);
      return 0;
    }
    const uint64_t now = read_clock(ctl_->clock);  // after the cursor: an upper bound for it
    if (rs.clock.anchor_w > rd || rd - rs.clock.anchor_w > cap) rs.clock.anchor_w = rd;  // forged cursors
    times_.begin(rs.clock, rs.found, data, cap, rd, w, now);
    // While the writer is moving, leave the cache line it is filling alone: reading it would
    // take the line away from the writer's core in the middle of its records.
    const uint64_t limit = (w == rs.seen_write || final || whole) ? w : w & ~uint64_t(63);
    rs.seen_write = w;
    size_t n = 0;
    rs.blocked = false;
    rs.read = rd;
    const uint64_t from = rd;
    uint64_t published = rd, looked = rd;
    const bool others = others_pending(index);
    uint64_t ahead = rd;  // records before it have had their live-map entries prefetched
    uint32_t in_flight = 0;  // records between rd and ahead
    // Distances, not comparisons of cursors: a forged cursor near 2^64 would wrap past `limit`.
    while (rd != limit && limit - rd <= cap) {
      prefetch_ahead(data, cap, limit, rd, &ahead, &in_flight);
      RecordAt rec;
      const Next next = next_record(data, cap, rd, w - rd, &rec);
      in_flight -= in_flight != 0;
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
      if ((kind == kAlloc || kind == kFree || kind == kRealloc || kind == kUnmap) && !rs.force &&
          !(satisfied(aux, index) && satisfied(dep_old, index) &&
            !free_pending(kind, aux, at, rs, index, others)) &&
          (unordered_final_ ? (unordered_++, false) : wait_at(rs, rd))) {
        rs.blocked = *any_blocked = true;
        break;
      }
      rs.force = false;
      const uint64_t event = event_name(index + 1, rd);
      rd += 8 * words;
      if (kind == kTime) continue;  // an anchor (EventTimes::begin)
      if (kind == kThread) {
        rs.tid = (uint32_t)aux;
        rs.clock.new_writer();  // another thread's pace
        continue;
      }
      n++;
      uint64_t ts, unc;
      times_.time_of(rs.clock, rd - 8 * words, &ts, &unc);
      const uint64_t ptr = at[1] & kPtrMask;
      // An allocation's recent stack: one with frames fills it, one without repeats it.
      const uint32_t recent =
          kind == kFree || kind == kUnmap ? 0 : uint32_t(at[2] >> kRecentShift);  // 1 + it, or 0
      RingState::Held* const held =
          recent && recent <= kRecentStacks ? &rs.recent[recent - 1] : nullptr;
      if (held && nf) held->depth = at[1] & ~kPtrMask;
      const uint64_t frame = pseudo_frame(held && !nf ? held->depth : at[1]);
      const char hk = hook_kind(op);
      if (kind == kUnmap) {  // the program's mappings (mappings.h): an unmap or a release
        if (hk == 'D')
          mappings_.release(ptr, at[2] & kSizeMask);
        else
          rs.remapped = mappings_.unmap(ptr, at[2] & kSizeMask);
      } else if (kind == kFree) {
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
        if (hk == 'M' || hk == 'X') {  // a mapping; mremap's only where it moved a known one
          if (hk == 'M' || rs.remapped) mappings_.map(ptr, at[2] & kSizeMask, stack);
          rs.remapped = false;
        } else {
          aggregates_.apply(
              {ts, ptr, at[2] & kSizeMask, below, frame, stack, rs.tid, op, 0, event, unc},
              ns_per_tick_);
        }
      }
      rs.read = rd;  // satisfied() looks here
      if (rd - looked >= kLookEvery) {  // room for a writer waiting on a full ring
        looked = rd;
        if (rd - published >= kPublishEvery || __atomic_load_n(&r->waiting, __ATOMIC_RELAXED)) {
          __atomic_store_n(&r->read, rd, __ATOMIC_RELEASE);
          wake_writer(r);
          published = rd;
        }
      }
    }
    __atomic_store_n(&r->read, rd, __ATOMIC_RELEASE);
    if (rd != from) wake_writer(r);
    // What comes after w was written after `now`: the next drain's first anchor.
    std::vector<Anchor>& looks = rs.clock.looks;
    const bool timely = close(before, now, ns_per_tick_);  // (close())
    if (rd == w) {
      times_.advance(rs.clock, {w, timely ? now : before});
      looks.clear();
    } else {  // the looks not passed yet, and this one
      looks.erase(looks.begin(), std::find_if(looks.begin(), looks.end(), [&](const Anchor& a) {
                    return a.w - from >= rd - from;
                  }));
      if (timely) note_look(looks, {w, now});
    }
    return n;
  }

  uint8_t* base_;
  const Control* ctl_;
  std::vector<RingState> rings_;
  StackTable stacks_;
  Aggregates aggregates_;
  Mappings mappings_;
  // prev_look_ts_: the clock at the last look at every ring (a drain's or look()'s).
  uint64_t prev_look_ts_, drain_ts_ = 0, applied_ = 0, unordered_ = 0;
  EventTimes times_;  // apply_ring()'s, for the ring it is applying
  double ns_per_tick_ = 1.0;
};

}  // namespace memhook
