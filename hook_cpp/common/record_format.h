// The records in a ring: their grammar, the header's encoding (the hooks write the rest of a
// record in hook_library/records.h), and reading them back. One decoder: the consumer's ring
// reader, and through the consumer module (_native.decode_records) the tests and fuzzers.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "arch.h"  // kUserAddressBits

namespace memhook {

constexpr int kMaxDepth = 128;  // native frames a backtrace walks at most (--depth)
// Frames a record carries at most: native ones, then Python ones (python_frames.h).
constexpr int kMaxRecordFrames = 192;

// Records are sequences of 8-byte words, the first a header:
//   bits 0-7 kind, 8-15 op (hook id), 16-23 nframes, 24-63 aux (a dependency, or a tid).
// kAlloc   hdr(aux=dep) ptr+depth size+recent frames...     (depth of the allocating function)
// kRealloc hdr(aux=dep of ptr) ptr+depth size+recent old dep_of_old frames...
// kFree    hdr(aux=dep) ptr+depth                      (depth of the free hook's frame)
// kUnmap   hdr(aux=dep) ptr+depth len                  (munmap, mremap's old range, madvise)
// kNop     hdr          (a realloc that failed)
// kTime    hdr ts       (clock reading; events after it happened no earlier)
// kThread  hdr(aux=tid) (the ring's writer from here on)
// kPadding hdr          (skip to the ring's start)
// ptr+depth: the pointer in the low kPtrBits bits; above them, how far the frame lies below the
// top of the thread's stack in 16-byte units (0: unknown). Comparing depths tells whether a
// block was freed while the call that allocated it was still active. An allocation that repeats
// a recent stack (below) sends no depth bits: it has the depth of the record that filled the entry.
//
// size+recent: the size in the low kRecentShift bits; above them, 1 + the ring's recent stack the
// frames are kept in (0: none). A kAlloc or kRealloc with frames and such a number fills that entry;
// one with no frames (a walk always yields the call site) repeats the stack the entry holds: the
// writer keeps the same stacks (RecentStack) and sends a stack only when it differs from the
// slot's.
//
// frames: return addresses, the call site first. A walk cut short ends with a marker no return
// address can be: kFrameNoUnwindInfo (code without unwind rows, where a frame-pointer step
// failed too, or CFI no row can express) or kFrameUnwindStopped (a row that led off the stack).
// In a Python process the native frames are followed by the thread's Python frames, innermost
// first (hook_library/python_frames.h), each a word no return address can be: bit 63 set, bit
// 62 on the outermost Python frame one _PyEval_EvalFrameDefault call ran, bits 32-61 the code
// object's record (its offset in the code area / 8, plus 1; 0: none, the area was full), bits
// 0-31 the byte offset of the instruction the frame was at. A walk that met something that is
// no frame of code ends with kPythonUnreadable.
//
// A dependency names an event by where it starts: (ring number 1..254) << 32 | (its start
// cursor / 8) mod 2^32; 0 is none. The event has been applied once the consumer's read cursor
// of that ring is past its start.
constexpr uint64_t event_name(uint64_t ring_no, uint64_t start) {
  return ring_no << 32 | uint32_t(start >> 3);
}
enum EventKind : uint8_t {
  kPadding = 0, kAlloc = 1, kFree = 2, kRealloc = 3, kNop = 4, kTime = 5, kThread = 6,
  kUnmap = 7
};
constexpr int kDepShift = 24;  // where the aux field starts in a header
constexpr int kPtrBits = arch::kUserAddressBits;  // user-space pointers
constexpr int kRecentShift = 56;
constexpr uint64_t kSizeMask = (uint64_t(1) << kRecentShift) - 1;
constexpr uint32_t kRecentStacks = 32;  // per ring; a power of two
constexpr uint64_t kFrameNoUnwindInfo = 1, kFrameUnwindStopped = 2;
constexpr uint64_t kPythonFrame = uint64_t(1) << 63, kPythonEntry = uint64_t(1) << 62;
constexpr int kPythonCodeShift = 32;
constexpr uint64_t kPythonUnreadable = kPythonFrame | 0xffffffffu;  // (code record 0)
constexpr uint64_t kPtrMask = (uint64_t(1) << kPtrBits) - 1;

constexpr uint64_t header(EventKind kind, int op, uint64_t nframes, uint64_t aux) {
  return uint64_t(kind) | uint64_t(op) << 8 | nframes << 16 | aux << kDepShift;
}

// A record's header, read back.
struct RecordHeader {
  uint8_t kind, op;
  uint32_t nframes;  // at most kMaxRecordFrames, whatever the header claims
  uint64_t aux;
};
inline RecordHeader decode_header(uint64_t hdr) {
  const uint32_t nf = uint32_t(hdr >> 16) & 0xff;
  return {uint8_t(hdr), uint8_t(hdr >> 8), nf < uint32_t(kMaxRecordFrames) ? nf : uint32_t(kMaxRecordFrames),
          hdr >> kDepShift};
}

// A record's length in words, from its header.
constexpr size_t record_words(uint8_t kind, uint32_t nf) {
  return kind == kAlloc ? 3 + nf : kind == kRealloc ? 5 + nf
       : kind == kFree || kind == kTime ? 2 : kind == kUnmap ? 3 : 1;
}

// The record at cursor `rd` of a ring of `cap` bytes (a power of two) whose writer published
// `avail` bytes from rd on. Ring contents are hostile: a record that claims more than was
// published, crosses the ring's end or has no known kind is malformed, and nothing is read
// outside the ring.
enum class Next { kRecord, kPadding, kMalformed };
struct RecordAt {
  const uint64_t* at;  // the header; the record's words follow
  RecordHeader h;
  uint64_t bytes;      // how far the cursor moves past it (a padding record: to the ring's start)
};
inline Next next_record(const uint8_t* data, uint64_t cap, uint64_t rd, uint64_t avail,
                        RecordAt* r) {
  const uint64_t pos = rd & (cap - 1);
  r->at = (const uint64_t*)(data + pos);
  r->h = decode_header(r->at[0]);
  if (r->h.kind == kPadding) {
    r->bytes = cap - pos;
    return Next::kPadding;
  }
  r->bytes = 8 * record_words(r->h.kind, r->h.nframes);
  if (r->h.kind > kUnmap || pos + r->bytes > cap || r->bytes > avail) return Next::kMalformed;
  return Next::kRecord;
}

}  // namespace memhook
