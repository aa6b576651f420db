// The AArch64 syscall stub (hook_cpp/arch/aarch64/syscall_stub.S) without ptrace, under
// qemu-user: the registers a thread must have afterwards are written into Control::call_regs as
// memhook writes them, and this program branches to the stub itself (enter_stub: the call's
// number in x8, getpid). The stub makes the call and returns through rt_sigreturn to `landing`,
// which keeps every register as it found it, then goes back to enter_stub's caller. Prints
// what landed against what was asked, one line each, and "bad N" at the end.
//   stub_harness_a64 LIBRARY SEGMENT
#include <signal.h>
#include <string.h>

#include "load_hook_library.h"

extern "C" {
uint64_t landed[36];   // x0-x30, nzcv, sp, (pad), v8
uint64_t saved[22];    // enter_stub's caller: x19-x30, sp, d8-d15
uint64_t v8_pattern[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
void enter_stub(uint64_t stub);
void landing();
}

asm(R"(
  .text
  .globl enter_stub
  .type enter_stub, %function
enter_stub:
  adrp x9, saved
  add x9, x9, :lo12:saved
  stp x19, x20, [x9, #0]
  stp x21, x22, [x9, #16]
  stp x23, x24, [x9, #32]
  stp x25, x26, [x9, #48]
  stp x27, x28, [x9, #64]
  stp x29, x30, [x9, #80]
  mov x10, sp
  str x10, [x9, #96]
  stp d8, d9, [x9, #112]
  stp d10, d11, [x9, #128]
  stp d12, d13, [x9, #144]
  stp d14, d15, [x9, #160]
  adrp x10, v8_pattern
  ldr q8, [x10, :lo12:v8_pattern]
  mov x8, #172          // getpid
  br x0

  .globl landing
  .type landing, %function
landing:                // every register as call_regs said: kept below sp first, flags untouched
  stp x0, x1, [sp, #-256]
  stp x2, x3, [sp, #-240]
  stp x4, x5, [sp, #-224]
  stp x6, x7, [sp, #-208]
  stp x8, x9, [sp, #-192]
  stp x10, x11, [sp, #-176]
  stp x12, x13, [sp, #-160]
  stp x14, x15, [sp, #-144]
  stp x16, x17, [sp, #-128]
  stp x18, x19, [sp, #-112]
  stp x20, x21, [sp, #-96]
  stp x22, x23, [sp, #-80]
  stp x24, x25, [sp, #-64]
  stp x26, x27, [sp, #-48]
  stp x28, x29, [sp, #-32]
  str x30, [sp, #-16]
  mrs x0, nzcv
  str x0, [sp, #-8]
  adrp x1, landed
  add x1, x1, :lo12:landed
  sub x2, sp, #256
  mov x3, #0
1:
  ldr x4, [x2, x3, lsl #3]
  str x4, [x1, x3, lsl #3]
  add x3, x3, #1
  cmp x3, #32
  b.lo 1b
  mov x4, sp
  str x4, [x1, #8 * 32]
  str q8, [x1, #8 * 34]
  adrp x9, saved
  add x9, x9, :lo12:saved
  ldp x19, x20, [x9, #0]
  ldp x21, x22, [x9, #16]
  ldp x23, x24, [x9, #32]
  ldp x25, x26, [x9, #48]
  ldp x27, x28, [x9, #64]
  ldp x29, x30, [x9, #80]
  ldr x10, [x9, #96]
  mov sp, x10
  ldp d8, d9, [x9, #112]
  ldp d10, d11, [x9, #128]
  ldp d12, d13, [x9, #144]
  ldp d14, d15, [x9, #160]
  ret
)");

alignas(16) static char stack[1 << 16];
static int bad;

static void expect(const char* what, uint64_t got, uint64_t want) {
  printf("%s %#lx %s\n", what, (unsigned long)got, got == want ? "ok" : "BAD");
  bad += got != want;
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  void* lib = load_hook_library(argv[1], argv[2]);
  if (!lib) return 4;
  auto stub = (uint64_t)dlsym(lib, "memhook_syscall_stub");
  auto* c = *(memhook::Control**)dlsym(lib, "memhook_ctl");
  if (!stub || !c) return 5;
  // A blocked signal and an alternate stack, both to be as they were.
  sigset_t usr2, mask;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  sigprocmask(SIG_BLOCK, &usr2, nullptr);
  static char alt[1 << 16];
  stack_t ss = {alt, 0, sizeof alt}, now;
  sigaltstack(&ss, nullptr);
  uint64_t regs[34];
  for (int i = 0; i < 31; i++) regs[i] = 0x5a5a000000000000ull | uint64_t(i) << 32 | uint64_t(i * 7);
  regs[31] = (uint64_t)(stack + sizeof stack - 1024);  // sp
  regs[32] = (uint64_t)&landing;                       // pc
  regs[33] = 0x60000000;                               // pstate: Z and C set
  for (int i = 0; i < 34; i++) c->call_regs[i] = regs[i];
  __atomic_store_n(&c->call_state, memhook::kCallArmed, __ATOMIC_SEQ_CST);
  enter_stub(stub);
  char name[16];
  for (int i = 0; i < 31; i++) {
    snprintf(name, sizeof name, "x%d", i);
    expect(name, landed[i], regs[i]);
  }
  expect("nzcv", landed[31], regs[33]);
  expect("sp", landed[32], regs[31]);
  expect("v8_lo", landed[34], v8_pattern[0]);
  expect("v8_hi", landed[35], v8_pattern[1]);
  expect("call_state", c->call_state, memhook::kCallTaken);
  expect("call_result", uint64_t(c->call_result), uint64_t(getpid()));
  sigprocmask(SIG_BLOCK, nullptr, &mask);
  expect("usr2_blocked", sigismember(&mask, SIGUSR2), 1);
  sigaltstack(nullptr, &now);
  expect("altstack", (uint64_t)now.ss_sp, (uint64_t)alt);
  printf("bad %d\n", bad);
  return 0;
}
