// memhook_syscall_stub: where the leak check has a stopped thread of the target make one system
// call (reachability/forked_image.h), as arch/x86_64/syscall_stub.S does. memhook writes the
// registers the thread must have after it into Control::call_regs (user_pt_regs: x0-x30, sp,
// pc, pstate), sets the call's number (x8) and arguments and the pc here, and lets the thread
// go. AArch64 cannot put every general register back and branch without one to branch through
// (x16 and x17 may be live where a thread stopped: inside a PLT stub), so the stub writes a
// signal frame below the thread's sp, as the kernel would for a handler, and returns through
// rt_sigreturn: every register, sp, pc and the flags from call_regs; the FP/SIMD registers,
// which nothing here touches, as they are; the signal mask and the alternate stack as they are.
// Whether memhook is there to see it or was killed meanwhile, the thread goes on as it would
// have. A clone() that copies the process leaves its copy here too, with 0 in x0: if the copy is
// ever let run, it exits at once and runs none of the program's code.
#include "asm_offsets.h"

  .text
  .globl memhook_syscall_stub
  .type memhook_syscall_stub, %function
  .p2align 2
memhook_syscall_stub:
  svc #0
  cbnz x0, 1f
  mov x8, #94                   // exit_group(0): the copy
  svc #0
1:
  adrp x9, :got:memhook_ctl
  ldr x9, [x9, #:got_lo12:memhook_ctl]
  ldr x9, [x9]
  movz x10, #(CTL_CALL_REGS & 0xffff)
  movk x10, #(CTL_CALL_REGS >> 16), lsl #16
  add x9, x9, x10               // call_regs
  str x0, [x9, #CALL_RESULT_FROM_REGS]   // (a copy's PID: reaped later if memhook is gone)
  // The frame, 16-aligned below the thread's sp, and sp there first: a signal that comes
  // meanwhile builds its own frame below it.
  ldr x10, [x9, #8 * 31]
  mov x11, #SIGFRAME_BYTES
  sub x10, x10, x11
  and x10, x10, #-16
  mov sp, x10
  add x11, sp, #SIGINFO_BYTES   // the ucontext
  stp xzr, xzr, [x11]           // uc_flags, uc_link
  // uc_mcontext: x0-x30, sp, pc, pstate, as call_regs has them
  add x12, x11, #UC_REGS
  mov x13, #0
2:
  ldr x14, [x9, x13, lsl #3]
  str x14, [x12, x13, lsl #3]
  add x13, x13, #1
  cmp x13, #34
  b.lo 2b
  // The FP/SIMD record (rt_sigreturn refuses a frame without one), then the terminator.
  add x12, x11, #UC_RESERVED
  movz w13, #(FPSIMD_MAGIC & 0xffff)
  movk w13, #(FPSIMD_MAGIC >> 16), lsl #16
  mov w14, #FPSIMD_BYTES
  stp w13, w14, [x12]
  mrs x13, fpsr
  mrs x14, fpcr
  stp w13, w14, [x12, #8]
  stp q0, q1, [x12, #16]
  stp q2, q3, [x12, #48]
  stp q4, q5, [x12, #80]
  stp q6, q7, [x12, #112]
  stp q8, q9, [x12, #144]
  stp q10, q11, [x12, #176]
  stp q12, q13, [x12, #208]
  stp q14, q15, [x12, #240]
  stp q16, q17, [x12, #272]
  stp q18, q19, [x12, #304]
  stp q20, q21, [x12, #336]
  stp q22, q23, [x12, #368]
  stp q24, q25, [x12, #400]
  stp q26, q27, [x12, #432]
  stp q28, q29, [x12, #464]
  stp q30, q31, [x12, #496]
  str xzr, [x12, #FPSIMD_BYTES]
  // The signal mask and the alternate stack as they are now.
  mov x0, #0                    // SIG_BLOCK, nothing added: the mask read
  mov x1, #0
  add x2, x11, #UC_SIGMASK
  mov x3, #8
  mov x8, #135                  // rt_sigprocmask
  svc #0
  mov x0, #0
  add x1, x11, #UC_STACK
  mov x8, #132                  // sigaltstack(NULL, &uc_stack)
  svc #0
  mov w13, #CALL_TAKEN
  add x14, x9, #CALL_STATE_FROM_REGS
  stlr w13, [x14]               // read: memhook may write the next call's
  mov x8, #139                  // rt_sigreturn: the thread where it was
  svc #0
  brk #0                        // (never: a refused frame is the kernel's SIGSEGV)
  .size memhook_syscall_stub, . - memhook_syscall_stub

  .section .note.GNU-stack, "", %progbits  // no executable stack
