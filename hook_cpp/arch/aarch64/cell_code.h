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

// LDR x16, #8; BR x16; the address: to anywhere. 16 bytes. x16 (IP0) is the register a veneer
// or PLT stub may clobber between any call and its callee, so no caller expects it kept.
inline size_t jump_abs(uint8_t* at, const void* to) {
  static const uint32_t kLdrBr[2] = {0x58000050u, 0xd61f0200u};  // ldr x16, .+8; br x16
  memcpy(at, kLdrBr, 8);
  memcpy(at + 8, &to, 8);
  return 16;
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
