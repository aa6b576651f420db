// Where a hook was called from, as the hook finds it in its own frame (hook_library/
// recent_stacks.h's Origin). On AArch64 `bl` leaves the return address in x30, which the hook's
// prologue stores with x29 as its frame record ([x29] the caller's x29, [x29 + 8] x30); but GCC
// puts that record at the bottom of the frame, not at its top, so the caller's stack pointer (the
// hook's CFA) is not a fixed distance from it: the hook passes its CFA too.
#pragma once
#include <stdint.h>

namespace memhook {
namespace arch {

struct HookFrame {
  void** fp;     // the hook's frame record
  uint64_t cfa;  // the hook's CFA: the caller's sp at the call
};
#define MEMHOOK_HOOK_FRAME() \
  (::memhook::arch::HookFrame{(void**)__builtin_frame_address(0), (uint64_t)__builtin_dwarf_cfa()})

// The call site: where its return address is stored, the caller's frame pointer and sp.
struct Origin {
  void** ret;
  void** frame;
  uint64_t sp;
};
inline Origin origin_of(HookFrame f) { return {f.fp + 1, (void**)f.fp[0], f.cfa}; }
inline uint64_t caller_sp(Origin from) { return from.sp; }
// The hook's frame base as x86-64 has it (its CFA - 16): a free's depth on the stack.
inline uint64_t frame_base(HookFrame f) { return f.cfa - 16; }
// The origin malloc_entry.S found: where it stored x30, the caller's x29 and sp.
inline Origin entry_origin(void** ret, void** frame, uint64_t sp) { return {ret, frame, sp}; }

}  // namespace arch
}  // namespace memhook
