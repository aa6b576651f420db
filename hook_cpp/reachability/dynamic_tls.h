// Dynamic TLS as roots: a library loaded with dlopen gets each thread's copy of its __thread
// variables when the thread first touches them, in a block glibc's loader allocates with
// malloc (__tls_get_addr), through no slot memhook patches. Those blocks lie in the heap,
// which is no root once its blocks are known: they are found through each thread's dynamic
// thread vector (the DTV) instead, as LeakSanitizer takes them.
//
// glibc's layout: the thread control block at the thread pointer holds `dtv`, a pointer to
// entry 1 of an array whose entry -1 counts the module slots; entry i (16 bytes) is module i's
// block: {val, to_free}, `to_free` the pointer malloc returned (0 for a module in static TLS),
// whose chunk's size word, 8 bytes before it, bounds the block.
#pragma once
#include <cstdint>
#include <vector>

#include "arch.h"
#include "roots.h"
#include "target_memory.h"
#include "thread_stop.h"

namespace memhook::reachability {

constexpr uint64_t kMaxDtvSlots = 1 << 16;
constexpr uint64_t kMaxTlsBlock = uint64_t(1) << 30;

inline std::vector<Range> dynamic_tls_blocks(census::TargetMemory& mem,
                                             const std::vector<StoppedThread>& threads) {
  std::vector<Range> out;
  for (const StoppedThread& t : threads) {
    if (t.regs.size() <= size_t(arch::kRegsThreadPointer)) continue;
    const uint64_t tp = t.regs[arch::kRegsThreadPointer];
    uint64_t dtv = 0, slots = 0;
    if (!tp || !mem.word(tp + arch::kTcbDtvOffset, &dtv) || !dtv || dtv % 8 ||
        !mem.word(dtv - 16, &slots) || slots > kMaxDtvSlots)
      continue;
    std::vector<uint64_t> entries(2 * slots);
    if (!slots || !mem.read(dtv + 16, entries.data(), entries.size() * 8)) continue;
    for (uint64_t i = 0; i < slots; i++) {
      const uint64_t to_free = entries[2 * i + 1];
      uint64_t size = 0;
      if (!to_free || to_free % 16 || !mem.word(to_free - 8, &size)) continue;
      size &= ~uint64_t(7);
      if (size > 8 && size < kMaxTlsBlock) out.push_back({to_free, to_free + size - 8, kDynamicTls});
    }
  }
  return out;
}

}  // namespace memhook::reachability
