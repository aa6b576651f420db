// Layout of the shared-memory segment between the hook library (writer, inside the target) and
// the consumer (reader, inside memhook). One control block, then one ring per writer thread.
//
// Ordering across rings: each event carries a timestamp taken *before* a free and *after* an
// allocation returns, so a pointer's free always sorts before its reuse. The consumer merges rings
// by timestamp up to a watermark that no in-flight event can undercut (see consumer.cpp).
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace memhook {

constexpr uint64_t kMagic = 0x314b4f4f484d454dULL;  // "MEMHOOK1" little-endian
constexpr uint32_t kVersion = 1;
constexpr int kMaxHooks = 40;        // hook ids (hooks.def) are < kMaxHooks
constexpr int kMaxDepth = 128;
constexpr int kMaxKnownObjects = 1024;
constexpr int kMaxLateSlots = 4096;
constexpr int kMaxSlots = 8192;

enum Clock : uint32_t { kClockTsc = 0, kClockMonotonic = 1 };
enum SlotState : uint32_t { kSlotEmpty = 0, kSlotPatched = 1, kSlotGone = 2 };

// A patched GOT/data slot: by memhook through GDB (Control::slots) or by the target itself for a
// library dlopen'ed after attach (Control::late). memhook restores both on detach; the target
// restores both itself if memhook dies.
struct PatchedSlot {
  uint64_t addr;
  uint64_t original;
  uint64_t hook;
  uint32_t hook_id;
  uint16_t state;     // SlotState
  uint16_t readonly;  // in a RELRO page: writable only through mprotect
};

struct alignas(64) Control {
  // Written by memhook before injection.
  uint64_t magic;
  uint32_t version;
  uint32_t control_bytes;  // sizeof(Control), checked by both sides
  uint32_t nrings;
  uint32_t ring_bytes;  // data bytes per ring, power of two
  uint32_t depth;       // max frames per backtrace
  uint32_t clock;       // Clock
  uint64_t min_size;    // size filter, inclusive
  uint64_t max_size;
  uint64_t target_pid;
  uint64_t real[kMaxHooks];  // address of each real function in the target, 0 if unknown
  uint32_t nknown;
  uint32_t pad0;
  uint64_t known_bases[kMaxKnownObjects];  // objects memhook handled (or skips) at attach

  // Futex word: a writer whose ring passes half full bumps it and wakes the consumer.
  alignas(64) uint32_t wake;
  uint32_t pad1;

  // The consumer's pulse (CLOCK_MONOTONIC ns). Older than abandon_after_ns: memhook is gone,
  // and the target unhooks itself.
  alignas(64) uint64_t heartbeat_ns;
  uint64_t abandon_after_ns;
  uint32_t abandoned;  // set by the target once it restored its slots
  uint32_t nslots;     // entries of `slots`, written by memhook's agent while the target is stopped
  PatchedSlot slots[kMaxSlots];

  // Written by the target.
  alignas(64) uint64_t lib_base;  // load bias of the hook library
  uint32_t started;
  uint32_t nlate;  // `late` entries in use
  alignas(64) uint64_t dropped_no_ring;  // events lost because every ring was owned
  alignas(64) PatchedSlot late[kMaxLateSlots];
};

// Producer and consumer fields live on separate cache lines; only the owning thread writes the
// producer line, only the consumer writes `read`.
struct alignas(64) RingHeader {
  uint32_t owner;    // kernel tid of the writer, 0 = free
  uint32_t pad0;
  uint64_t write;    // total bytes published (monotonic)
  uint64_t busy;     // nonzero while an event is between its timestamp and its publication
  uint64_t dropped;  // events dropped because the ring was full
  uint8_t pad1[32];
  alignas(64) uint64_t read;  // total bytes consumed (monotonic)
  uint8_t pad2[56];
};

enum EventKind : uint8_t { kPadding = 0, kAlloc = 1, kFree = 2, kRealloc = 3 };

// One event. Records are 8-byte aligned and variable-length: header, then for kRealloc a
// RecordRealloc, for kAlloc and kRealloc a RecordFrame, then `nframes` return addresses.
// kind == kPadding: skip to the ring's start.
struct Record {
  uint8_t kind;      // EventKind: decides the layout
  uint8_t op;        // hook id: what the target called
  uint16_t nframes;
  uint32_t tid;
  uint64_t ts;       // after an allocation returned / before a free began
  uint64_t ptr;      // pointer allocated or freed
  uint64_t size;     // bytes requested; for frees, the hook's frame address
};
struct RecordRealloc {
  uint64_t ts_free;  // taken before the real call: when `old` stopped being ours
  uint64_t old;      // pointer passed in (0 for realloc(NULL, n))
};
// After the header (and RecordRealloc) of every allocation: where on the stack it happened, so
// the consumer can tell whether the block is freed while the allocating call is still active.
// Frees carry their hook's frame address in Record::size.
struct RecordFrame {
  uint64_t hook_frame;    // the hook's own frame address
  uint64_t caller_frame;  // frame base of the function that called the allocator, 0 if unknown
};

inline size_t ring_stride(uint32_t ring_bytes) { return sizeof(RingHeader) + ring_bytes; }
inline size_t rings_offset() { return (sizeof(Control) + 4095) & ~size_t(4095); }
inline size_t segment_bytes(uint32_t nrings, uint32_t ring_bytes) {
  return rings_offset() + size_t(nrings) * ring_stride(ring_bytes);
}

}  // namespace memhook
