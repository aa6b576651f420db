// A new segment's control block, written by memhook before injection (the target checks it in
// memhook_start). Header-only: the consumer extension is one translation unit (bindings.cpp).
#pragma once
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cell_code.h"  // arch::kJumpBytes
#include "clock.h"
#include "segment.h"
#include "unwind_rows.h"

namespace memhook {

// A slot memhook found and wants patched (hook_library/slots.h decides, with the target stopped).
struct PlannedSlot {
  uint64_t addr;
  uint32_t hook_id;
  uint64_t real;               // the real function, 0 if unknown
  uint64_t lazy_lo, lazy_hi;   // its object's PLT
  bool readonly;               // in a RELRO page
};

// An entry patch memhook planned (memhook/entry_patch/).
struct PlannedEntry {
  uint64_t addr, cell;
  uint32_t hook_id, length;
  std::string original, trampoline;
};

// Size and fill a new segment file (created by Python with O_EXCL, owner-only).
inline void format_segment(int fd, uint32_t nrings, uint32_t ring_bytes, uint32_t depth, uint32_t clock,
                    uint64_t min_size, uint64_t max_size, uint64_t pid,
                    const std::unordered_map<int, uint64_t>& real,
                    const std::vector<uint64_t>& known, double abandon_after_s,
                    uint64_t sample_rate, bool no_avx512, uint64_t unwind_bytes,
                    uint64_t owner_pid, uint64_t owner_start,
                    const std::vector<PlannedSlot>& plan = {},
                    uint64_t entry_area = 0, uint32_t entry_area_bytes = 0,
                    const std::vector<PlannedEntry>& entries = {}, uint64_t max_wait_ns = 0,
                    bool lossless = false, uint64_t python_bytes = 0) {
  if (nrings == 0 || nrings > kMaxRings)
    throw std::invalid_argument("rings must be between 1 and " + std::to_string(kMaxRings));
  if (ring_bytes < 4096 || (ring_bytes & (ring_bytes - 1)) != 0)
    throw std::invalid_argument("ring size must be a power of two of at least 4096 bytes");
  if (depth < 1 || depth > (uint32_t)kMaxDepth)
    throw std::invalid_argument("depth must be between 1 and " + std::to_string(kMaxDepth));
  if (plan.size() > (size_t)kMaxSlots)
    throw std::invalid_argument("more than " + std::to_string(kMaxSlots) + " slots to patch");
  if (entries.size() > (size_t)kMaxEntries)
    throw std::invalid_argument("more than " + std::to_string(kMaxEntries) + " entries to patch");
  for (const PlannedEntry& e : entries)
    if (e.length < (uint32_t)arch::kJumpBytes || e.length > (uint32_t)kEntryOriginal ||
        e.original.size() != (size_t)kEntryOriginal ||
        e.trampoline.size() > (size_t)(kEntryCell - kEntryStub) || e.hook_id == 0 ||
        e.hook_id >= (uint32_t)kMaxHooks || e.cell < entry_area ||
        e.cell + kEntryCell > entry_area + entry_area_bytes)
      throw std::invalid_argument("an entry patch plan out of bounds");
  if (unwind_bytes > kMaxUnwindBytes || unwind_bytes % 4096)
    throw std::invalid_argument("unwind area must be a multiple of 4096 bytes, at most 1 GiB");
  if (python_bytes > kMaxCodeAreaBytes || python_bytes % 4096)
    throw std::invalid_argument("code area must be a multiple of 4096 bytes, at most 1 GiB");
  const size_t at = unwind_offset(nrings, ring_bytes, depth);
  if (ftruncate(fd, (off_t)(at + unwind_bytes + python_bytes)) != 0)
    throw std::runtime_error("cannot size segment");
  if (unwind_bytes) {  // the area's header: nothing published yet
    UnwindArea head{};
    head.used = sizeof(UnwindArea);
    head.capacity = unwind_bytes;
    if (pwrite(fd, &head, sizeof head, (off_t)at) != (ssize_t)sizeof head)
      throw std::runtime_error("cannot write segment");
  }
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
  c->owner_pid = owner_pid;
  c->owner_start = owner_start;
  c->unwind_bytes = unwind_bytes;
  c->python_bytes = python_bytes;
  c->heartbeat_ns = monotonic_ns();  // the pulse starts now: memhook dying before attach counts
  c->abandon_after_ns = (uint64_t)(abandon_after_s * 1e9);
  c->max_wait_ns = std::min<uint64_t>(max_wait_ns, kMaxWaitNs);
  c->lossless = lossless;
  for (auto& [id, addr] : real)
    if (id > 0 && id < kMaxHooks) c->real[id] = addr;
  c->nknown = (uint32_t)std::min<size_t>(known.size(), kMaxKnownObjects);
  for (uint32_t i = 0; i < c->nknown; i++) c->known_bases[i] = known[i];
  for (size_t i = 0; i < plan.size(); i++) {
    const PlannedSlot& p = plan[i];
    c->slots[i] = PatchedSlot{p.addr, p.real, 0, p.hook_id, (uint16_t)kSlotPlanned,
                              (uint16_t)p.readonly};
    c->lazy[i] = LazyRange{p.lazy_lo, p.lazy_hi};
  }
  c->nslots = (uint32_t)plan.size();
  c->entry_area = entry_area;
  c->entry_area_bytes = entry_area_bytes;
  for (size_t i = 0; i < entries.size(); i++) {
    const PlannedEntry& e = entries[i];
    EntryPatch& x = c->entries[i];
    x.addr = e.addr;
    x.cell = e.cell;
    x.hook_id = e.hook_id;
    x.length = (uint16_t)e.length;
    x.state = kEntryPlanned;
    x.trampoline_len = (uint16_t)e.trampoline.size();
    std::memcpy(x.original, e.original.data(), kEntryOriginal);
    std::memcpy(x.trampoline, e.trampoline.data(), e.trampoline.size());
  }
  c->nentries = (uint32_t)entries.size();
  __atomic_store_n(&c->magic, kMagic, __ATOMIC_RELEASE);
  munmap(m, sizeof(Control));
}

}  // namespace memhook
