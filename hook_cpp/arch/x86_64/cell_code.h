// The machine code the hook library writes into an entry patch's cell (hook_library/
// entry_patches.h) and over the function's first bytes: x86-64 encodings, in one place. A cell
// is [kEntryStub bytes of stubs][the trampoline memhook relocated]; the function's entry jumps
// to the cell's first stub, or in sampling sessions to its sampler.
#pragma once
#include <stdint.h>
#include <string.h>

namespace memhook {
namespace arch {

constexpr int kJumpBytes = 5;  // what a patched entry starts with: jmp rel32
// Sampling sessions write malloc's and free's sample entries into the cell (sample_malloc and
// sample_free below).
#define MEMHOOK_INLINE_SAMPLERS 1

// jmp rel32 from `at` to `to` (within 2 GiB: memhook placed the area so).
inline void jump_near(uint8_t* out, uint64_t at, uint64_t to) {
  const int32_t rel = (int32_t)((int64_t)to - (int64_t)(at + kJumpBytes));
  out[0] = 0xe9;
  memcpy(out + 1, &rel, 4);
}

// Whether the 5 bytes at `at` are a jmp rel32 to `to`.
inline bool jumps_to(const uint8_t* at, uint64_t to) {
  int32_t rel;
  memcpy(&rel, at + 1, 4);
  return at[0] == 0xe9 && (uint64_t)at + kJumpBytes + rel == to;
}

// jmp *0(%rip) and the address: to anywhere. 14 bytes.
inline size_t jump_abs(uint8_t* at, const void* to) {
  static const uint8_t kJmpAbs[6] = {0xff, 0x25, 0, 0, 0, 0};
  memcpy(at, kJmpAbs, 6);
  memcpy(at + 6, &to, 8);
  return 14;
}

// The thread pointer (%fs:0 holds itself on x86-64): a variable of initial-exec TLS lies at the
// same offset from it in every thread.
inline intptr_t thread_pointer() {
  intptr_t tp;
  asm("mov %%fs:0, %0" : "=r"(tp));
  return tp;
}

inline int8_t rel8(const uint8_t* from_end, const uint8_t* to) { return (int8_t)(to - from_end); }

// malloc's sample entry (memhook_sample_malloc's, inline), written to end where the trampoline
// begins: subtract the size (%rdi) from the countdown at %fs:`left` (one instruction, as
// arch::count_down); while bytes remain, fall through into the trampoline, else to `due` (a
// stub to the recording entry, within 128 bytes before). Returns where it starts.
constexpr size_t kSampleMallocBytes = 11;
inline uint8_t* sample_malloc(uint8_t* trampoline, int32_t left, const uint8_t* due) {
  static const uint8_t kSub[5] = {0x64, 0x48, 0x29, 0x3c, 0x25};  // sub %rdi, %fs:disp32
  uint8_t* const at = trampoline - kSampleMallocBytes;
  memcpy(at, kSub, 5);
  memcpy(at + 5, &left, 4);
  at[9] = 0x7e, at[10] = (uint8_t)rel8(trampoline, due);  // jle due
  return at;
}

// free's sample entry (memhook_sample_free's, inline): free(NULL) and pointers whose counter in
// `filter` (sampler.h's sampled_counter: ((p ^ p >> 12) >> 4) & 4095) is zero go on to `pass`,
// the rest to `maybe` (a stub to the hook, which asks the address table). Clobbers %rax and
// %r11, which no caller expects kept across a call. 43 bytes.
inline size_t sample_free(uint8_t* at, const uint8_t* filter, const uint8_t* maybe,
                          const uint8_t* pass) {
  static const uint8_t kHash[23] = {
      0x48, 0x85, 0xff,              // test %rdi,%rdi
      0x74, 0x00,                    // je pass (rel8 below)
      0x48, 0x89, 0xf8,              // mov %rdi,%rax
      0x48, 0xc1, 0xe8, 0x0c,        // shr $12,%rax
      0x48, 0x31, 0xf8,              // xor %rdi,%rax
      0x48, 0xc1, 0xe8, 0x04,        // shr $4,%rax
      0x25, 0xff, 0x0f, 0x00};       // and $0xfff,%eax (imm32's last byte next)
  uint8_t* p = at;
  memcpy(p, kHash, sizeof kHash);
  p[sizeof kHash] = 0x00;
  p[4] = (uint8_t)rel8(p + 5, pass);
  p += sizeof kHash + 1;
  p[0] = 0x49, p[1] = 0xbb;  // movabs $filter,%r11
  memcpy(p + 2, &filter, 8);
  p += 10;
  static const uint8_t kCmp[5] = {0x41, 0x80, 0x3c, 0x03, 0x00};  // cmpb $0,(%r11,%rax)
  memcpy(p, kCmp, 5);
  p += 5;
  p[0] = 0x75, p[1] = (uint8_t)rel8(p + 2, maybe);  // jne maybe
  p += 2;
  p[0] = 0xeb, p[1] = (uint8_t)rel8(p + 2, pass);   // jmp pass
  return (size_t)(p + 2 - at);
}

}  // namespace arch
}  // namespace memhook
