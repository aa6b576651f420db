// Ring pages ahead of their writers: the consumer allocates the segment's pages (fallocate, in
// memhook's process) a chunk ahead of each claimed ring's write cursor, so that a writer in the
// target maps pages that exist (a minor fault) instead of having the kernel allocate and zero
// them inside a hook. The hook library faults in only a ring's first chunk when it claims it
// (hook_library/ring_writer.h); populating whole 4 MiB rings there cost a program of 400
// short threads most of its time under memhook (benchmarks/versus_heaptrack.py).
#pragma once
#include <fcntl.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "segment.h"

namespace memhook {

class RingPages {
 public:
  static constexpr uint64_t kAhead = 512 << 10;  // bytes allocated ahead of a writer

  // One look at every ring (the drain thread's, between drains).
  void ahead(const uint8_t* base, int fd) {
    const Control* ctl = (const Control*)base;
    const uint64_t cap = ctl->ring_bytes;
    if (done_.size() != ctl->nrings) done_.assign(ctl->nrings, 0);
    for (uint32_t i = 0; i < ctl->nrings; i++) {
      uint64_t& done = done_[i];
      if (done >= cap) continue;  // the whole ring exists
      const size_t at = rings_offset() + size_t(i) * ring_stride(ctl->ring_bytes);
      const RingHeader* r = (const RingHeader*)(base + at);
      if (!__atomic_load_n(&r->owner, __ATOMIC_RELAXED)) continue;  // no writer yet
      const uint64_t w = std::min<uint64_t>(__atomic_load_n(&r->write, __ATOMIC_RELAXED), cap);
      if (w + kAhead / 2 <= done) continue;
      const uint64_t want = std::min(cap, std::max(done, w) + kAhead);
      // (no room in the file system: the writer faults its pages in itself, as before)
      if (fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)(at + sizeof(RingHeader) + done),
                    (off_t)(want - done)) != 0)
        done = cap;
      else
        done = want;
    }
  }

 private:
  std::vector<uint64_t> done_;  // per ring: data bytes allocated from its start
};

}  // namespace memhook
