// The machine code the hook library writes into an entry patch's cell (hook_library/
// entry_patches.h) and over the function's first instruction: A64 encodings. A cell is
// [kEntryStub bytes of stubs][the trampoline memhook relocated]; the function's entry branches
// to the cell's first stub. Every instruction is 4 bytes, so the patch displaces exactly one.
#pragma once
#include <stdint.h>
#include <string.h>

namespace memhook {
namespace arch {

constexpr int kJumpBytes = 4;  // what a patched entry starts with: B imm26 (within 128 MiB)
// No sample entries written inline yet: a sampling session's stub goes to the hook library's
// own (memhook_sample_*), which counts down just the same.
#define MEMHOOK_INLINE_SAMPLERS 0

// B from `at` to `to` (within 128 MiB either way: memhook placed the area so).
inline void jump_near(uint8_t* out, uint64_t at, uint64_t to) {
  const uint32_t insn = 0x14000000u | (uint32_t((int64_t)(to - at) >> 2) & 0x03ffffffu);
  memcpy(out, &insn, 4);
}

// Whether the instruction at `at` is a B to `to`.
inline bool jumps_to(const uint8_t* at, uint64_t to) {
  uint32_t insn;
  memcpy(&insn, at, 4);
  if ((insn & 0xfc000000u) != 0x14000000u) return false;
  const int64_t off = int64_t(int32_t(insn << 6) >> 6) * 4;  // imm26, sign-extended, in bytes
  return (uint64_t)at + off == to;
}

// The stub a patched entry branches to: XPACLRI, then LDR x16 / BR x16 to the hook, anywhere.
// 24 bytes. A function whose first instruction signs the return address (PACIASP, kept where it
// is: memhook patches the instruction after it) has signed x30 by the time it gets here; the hook
// returns through x30 as any function does, so the stub strips it first (a no-op for an unsigned
// one, and on a processor without PAC). x16 (IP0) is the register a veneer or PLT stub may
// clobber between any call and its callee, so no caller expects it kept.
inline size_t jump_abs(uint8_t* at, const void* to) {
  static const uint32_t kStub[4] = {0xd50320ffu,   // xpaclri
                                    0x58000070u,   // ldr x16, .+12 (the address below)
                                    0xd61f0200u,   // br x16
                                    0xd4200000u};  // brk #0 (never reached)
  memcpy(at, kStub, 16);
  memcpy(at + 16, &to, 8);
  return 24;
}

// The thread pointer (TPIDR_EL0): a variable of initial-exec TLS lies at the same offset from it
// in every thread.
inline intptr_t thread_pointer() {
  intptr_t tp;
  asm("mrs %0, tpidr_el0" : "=r"(tp));
  return tp;
}

}  // namespace arch
}  // namespace memhook
