// Which blocks a pointer reaches, as valgrind's memcheck decides (mc_leakcheck.c): every aligned
// word of a root or of a reached block that points to a block's start or into it is followed;
// cycles end where a block was seen. From the roots:
//   reachable      reached by start pointers only, from roots and reachable blocks;
//   possibly lost  reached, but some pointer on every path points into the block, not to its start;
// then among the rest, in address order, each block not yet reached leads a clique of those it
// reaches (interior pointers too):
//   indirectly lost  reached from a lost block (a lost list's tail, a lost tree's children);
//   definitely lost  no pointer from a root or another block's clique: the leaders.
// A lost cycle is one leader (definitely lost) and the rest indirectly lost, as valgrind says;
// LeakSanitizer calls the whole cycle indirect (docs/leak-analysis.md).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "arch.h"

namespace memhook::reachability {

enum State : uint8_t { kUnreached = 0, kReachable, kPossible, kIndirect };
enum Category : uint8_t { kDefinitelyLost = 0, kIndirectlyLost, kPossiblyLost, kStillReachable };

struct Block {
  uint64_t addr, size;
  uint32_t stack;  // the allocating stack (the consumer's id), or kBeforeAttach
  uint8_t state = kUnreached;
};
constexpr uint32_t kBeforeAttach = UINT32_MAX;

inline Category category(uint8_t state) {
  switch (state) {
    case kReachable: return kStillReachable;
    case kPossible: return kPossiblyLost;
    case kIndirect: return kIndirectlyLost;
    default: return kDefinitelyLost;
  }
}

// A stable LSD radix sort by address, 16 bits a pass over the bits addresses use: a million
// blocks in a few passes over memory (std::sort took 70-100 ms of the pause for them).
inline void sort_by_address(std::vector<Block>& v) {
  uint64_t top = 0;
  for (const Block& b : v) top |= b.addr;
  std::vector<Block> tmp(v.size());
  std::vector<size_t> count(size_t(1) << 16);
  for (int shift = 0; shift < 64 && (top >> shift); shift += 16) {
    std::fill(count.begin(), count.end(), 0);
    for (const Block& b : v) count[(b.addr >> shift) & 0xffff]++;
    size_t sum = 0;
    for (size_t& c : count) sum += std::exchange(c, sum);
    for (const Block& b : v) tmp[count[(b.addr >> shift) & 0xffff]++] = b;
    v.swap(tmp);
  }
}

class Marking {
 public:
  // `blocks`: the session's first, then the census's.
  explicit Marking(std::vector<Block> blocks) : blocks_(std::move(blocks)) {
    sort_by_address(blocks_);
    // Two blocks at one address (a census block freed unseen and the address reused): the
    // session's, which comes first (the sort is stable).
    blocks_.erase(std::unique(blocks_.begin(), blocks_.end(),
                              [](const Block& a, const Block& b) { return a.addr == b.addr; }),
                  blocks_.end());
    if (!blocks_.empty()) {
      lo_ = blocks_.front().addr;
      for (const Block& b : blocks_) hi_ = std::max(hi_, b.addr + std::max<uint64_t>(b.size, 1));
    }
  }

  std::vector<Block>& blocks() { return blocks_; }
  // An interior pointer that reaches its block all the same (interior_heuristics.h).
  std::function<bool(const Block&, uint64_t)> heuristic;
  size_t pending() const { return stack_.size(); }

  // The block `p` points to or into, or -1.
  int64_t find(uint64_t p) const {
    if (p < lo_ || p >= hi_) return -1;
    auto it = std::upper_bound(blocks_.begin(), blocks_.end(), p,
                               [](uint64_t v, const Block& b) { return v < b.addr; });
    if (it == blocks_.begin()) return -1;
    --it;
    const uint64_t end = it->addr + std::max<uint64_t>(it->size, 1);
    return p < end ? int64_t(it - blocks_.begin()) : -1;
  }

  // Words of a root (definite) or of a reached block (definite if that block is reachable).
  void scan(const uint64_t* words, size_t n, bool definite) {
    for (size_t i = 0; i < n; i++) {
      const uint64_t p = words[i] & arch::kPointerBits;
      if (p < lo_ || p >= hi_) continue;
      const int64_t k = find(p);
      if (k < 0) continue;
      Block& b = blocks_[size_t(k)];
      if (clique_ >= 0) {  // the clique pass: anything not yet reached joins the leader's
        if (b.state == kUnreached && k != clique_) {
          b.state = kIndirect;
          stack_.push_back(uint32_t(k));
        }
        continue;
      }
      const uint8_t via = definite && (p == b.addr || (heuristic && heuristic(b, p)))
                              ? kReachable : kPossible;
      if (b.state == kUnreached || (b.state == kPossible && via == kReachable)) {
        b.state = via;
        stack_.push_back(uint32_t(k));
      }
    }
  }

  // Process the blocks reached so far: `read(block, scan)` hands each block's words to scan.
  // Taken in batches (`batch` blocks at most) so that the reader can fetch many in one call.
  // Returns false if `more()` said stop (the deadline).
  template <class ReadBatch, class More>
  bool run(ReadBatch read_batch, More more, size_t batch = 512) {
    std::vector<uint32_t> take;
    while (!stack_.empty()) {
      if (!more()) return false;
      const size_t n = std::min(batch, stack_.size());
      take.assign(stack_.end() - n, stack_.end());
      stack_.resize(stack_.size() - n);
      read_batch(take, [this](uint32_t k, const uint64_t* words, size_t nwords) {
        scan(words, nwords, blocks_[k].state == kReachable);
      });
    }
    return true;
  }

  // After the roots: each block still unreached, in address order, leads a clique.
  template <class ReadBatch, class More>
  bool cliques(ReadBatch read_batch, More more) {
    for (size_t i = 0; i < blocks_.size(); i++) {
      if (blocks_[i].state != kUnreached) continue;
      clique_ = int64_t(i);
      stack_.push_back(uint32_t(i));
      if (!run(read_batch, more)) return false;
    }
    clique_ = -1;
    return true;
  }

 private:
  std::vector<Block> blocks_;
  std::vector<uint32_t> stack_;
  uint64_t lo_ = 0, hi_ = 0;
  int64_t clique_ = -1;
};

}  // namespace memhook::reachability
