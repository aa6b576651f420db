// When each event happened, without a clock read per event: the hooks write a clock record every
// kTimeEveryBytes of a thread's records, and the consumer notes the clock each time it finds a
// ring's write cursor. An event is timed between the anchors around it, in proportion to its
// place among the bytes written between them, with the part of that window its thread may have
// spent idle as its uncertainty (README "Lifetimes"; docs/benchmarks.md has the figures).
#pragma once
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "record_format.h"

namespace memhook {

constexpr uint64_t kPaceBytes = 1024;  // windows shorter than this set no pace
constexpr uint32_t kPaces = 32;        // recent windows' paces kept per ring
constexpr uint32_t kMinPaces = 8;      // fewer: no pace known, every window uncertain

// One ring's time: the latest anchor at or before its read cursor (a clock record, or the
// writer's cursor as a drain found it, with the consumer's clock right after), and the writer's
// busy pace (bytes per tick: the fastest of its recent windows of 1 KiB or more, once there are a
// few; a slower one would take a window the thread partly slept through for a busy one), which
// tells how much of a window it may have been idle.
// An anchor: every event before cursor `w` happened no later than `t`, every event after it no
// earlier (a clock record the writer wrote at w; or w as the consumer found the write cursor,
// and its clock read just after).
struct Anchor {
  uint64_t w, t;
};

struct RingClock {
  uint64_t anchor_w = 0, anchor_t = 0;
  // The consumer's looks at the write cursor since the ring was last applied to it, in order:
  // the drain thread looks every millisecond while events wait but applies them only now and
  // then (ring_reader.h: look), and each look bounds the events around it as a drain would have.
  std::vector<Anchor> looks;
  bool anchored = false;
  double peak_rate = 0;
  float paces[kPaces] = {};
  uint32_t npaces = 0;

  // A ring's first look (a drain's or a look's): its first events came no earlier than the
  // previous look at every ring, which found it empty.
  void first_look(uint64_t rd, uint64_t prev_look_t) {
    if (anchored) return;
    anchor_w = rd;
    anchor_t = prev_look_t;
    anchored = true;
  }
  // A look that found nothing waiting at w, at time t: the writer's next events come after it
  // (a quiet thread's next window starts here, not at its last record).
  void quiet(uint64_t w, uint64_t t) {
    if (anchor_w == w && looks.empty()) anchor_t = std::max(anchor_t, t);
  }

  void new_writer() {  // another thread's records from here on: another pace
    peak_rate = 0;
    npaces = 0;
  }
};

// The anchors of what one drain reads of one ring, and the window the next event lies in.
class EventTimes {
 public:
  // The clock records in what the writer published from `rd` to `w`, in order, then (w, now):
  // the anchors the events between them are timed by. Headers only; what apply_ring() finds
  // malformed it skips, so this one stops there too.
  // Before a ring's events are timed: its anchors from `rd` to the write cursor `w`, found with
  // the consumer's clock `now`.
  // What find_anchors read of one ring, kept between its calls: the clock records from `from`
  // up to `to`. When dependencies chain between rings, the final drain goes round them once per
  // event of the chain; reading every header up to the write cursor each time made 1 in 10
  // `memhook run`s of a 400-thread program take its 2 s bound. Each header is now read once.
  struct Found {
    std::vector<Anchor> anchors;
    uint64_t from = 0, to = 0;
    bool valid = false;
  };

  void begin(const RingClock& rs, Found& found, const uint8_t* data, uint64_t cap, uint64_t rd,
             uint64_t w, uint64_t now) {
    find_anchors(rs, found, data, cap, rd, w, now);
    next_anchor_ = 0;
    window_ready_ = false;
  }

  void find_anchors(const RingClock& rs, Found& found, const uint8_t* data, uint64_t cap,
                    uint64_t rd, uint64_t w, uint64_t now) {
    const uint64_t from = rd;
    // Distances, not comparisons: cursors wrap, and a forged one must only cost a rescan.
    if (!found.valid || rd - found.from > found.to - found.from || w - found.to > cap ||
        w - rd > cap) {
      found.anchors.clear();
      found.from = found.to = rd;
      found.valid = true;
    }
    size_t passed = 0;  // anchors before rd: applied already
    while (passed < found.anchors.size() && found.anchors[passed].w - found.from < rd - found.from)
      passed++;
    found.anchors.erase(found.anchors.begin(), found.anchors.begin() + passed);
    found.from = rd;
    uint64_t at = found.to;
    while (at != w && w - at <= cap) {
      RecordAt r;
      const Next next = next_record(data, cap, at, w - at, &r);
      if (next == Next::kMalformed) break;
      if (next == Next::kRecord && r.h.kind == kTime) found.anchors.push_back({at, r.at[1]});
      at += r.bytes;
    }
    found.to = at;
    anchors_.assign(found.anchors.begin(), found.anchors.end());
    for (const Anchor& look : rs.looks)  // from `from` up to w: in cursor order
      if (look.w - from <= w - from)
        anchors_.insert(std::upper_bound(anchors_.begin(), anchors_.end(), look,
                                         [](const Anchor& x, const Anchor& y) { return x.w < y.w; }),
                        look);
    anchors_.push_back({w, now});
  }

  // When the event at cursor `c` happened, between the anchors around it (in proportion to its
  // place among the bytes the writer wrote between them), and how much of that window the
  // writer may have spent idle: the time it would not have needed at its fastest seen pace.
  // An event in a busy window is timed to a small fraction of it; one in a window its thread
  // mostly slept through, only to the window.
  void time_of(RingClock& rs, uint64_t c, uint64_t* ts, uint64_t* uncertainty) {
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
  void window(const RingClock& rs) {
    const Anchor& b = anchors_[std::min(next_anchor_, anchors_.size() - 1)];
    const uint64_t bt = std::max(b.t, rs.anchor_t);
    const uint64_t span_t = bt - rs.anchor_t, span_w = b.w > rs.anchor_w ? b.w - rs.anchor_w : 0;
    window_scale_ = span_w ? double(span_t) / double(span_w) : 0.0;
    const double busy = span_w && rs.peak_rate > 0 ? double(span_w) / rs.peak_rate : 0.0;
    window_uncertainty_ = busy < double(span_t) ? uint64_t(double(span_t) - busy) : 0;
    window_ready_ = true;
  }

  // Past anchor `a`: the window that ended there tells the writer's pace.
  void advance(RingClock& rs, const Anchor& a) {
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


 private:
  std::vector<Anchor> anchors_;
  size_t next_anchor_ = 0;
  bool window_ready_ = false;  // window_scale_ and window_uncertainty_ hold for next_anchor_
  double window_scale_ = 0;
  uint64_t window_uncertainty_ = 0;
};

}  // namespace memhook
