// Where a hook was called from, as the hook finds it in its own frame (hook_library/
// recent_stacks.h's Origin): on x86-64 the frame pointer alone says it all, since `call` pushed
// the return address right below the caller's stack pointer and the hook's prologue pushed rbp
// below that: [rbp] the caller's rbp, [rbp + 8] the return address, rbp + 16 the caller's sp.
#pragma once
#include <stdint.h>

namespace memhook {
namespace arch {

// What a hook passes on to the code that records its call: its frame pointer.
using HookFrame = void**;
#define MEMHOOK_HOOK_FRAME() ((void**)__builtin_frame_address(0))

// The call site: where its return address is stored and the caller's frame pointer.
struct Origin {
  void** ret;
  void** frame;
};
inline Origin origin_of(HookFrame fp) { return {fp + 1, (void**)fp[0]}; }
// The caller's stack pointer once the call returned: just above its return address.
inline uint64_t caller_sp(Origin from) { return (uint64_t)(from.ret + 1); }
// The hook's frame base (its CFA - 16), a free's depth on the stack (records.h: with_depth).
inline uint64_t frame_base(HookFrame fp) { return (uint64_t)fp; }
// The origin malloc_entry.S found: where the return address is (the caller's sp is above it).
inline Origin entry_origin(void** ret, void** frame, uint64_t /*sp*/) { return {ret, frame}; }

}  // namespace arch
}  // namespace memhook
