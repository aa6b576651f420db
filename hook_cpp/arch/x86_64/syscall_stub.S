// memhook_syscall_stub: where the leak check has a stopped thread of the target make one system
// call (reachability/forked_image.h): memhook writes the registers the thread must have after it
// into Control::call_regs (user_regs_struct's order; a system call the thread was interrupted in
// set to restart, as the kernel would have), sets the call's number and arguments and the
// program counter here, and lets the thread go. The stub puts every register back by itself (and
// says so in Control::call_state, so that memhook writes no other thread's over them before) and
// returns to where the thread was: whether memhook is there to see it or was killed meanwhile,
// the thread goes on as it would have. A clone() that copies the process leaves its copy here
// too, with 0 in %rax: if the copy is ever let run (memhook gone before it set the copy to die
// with it), it exits at once and runs none of the program's code.
#include "asm_offsets.h"

  .text
  .globl memhook_syscall_stub
  .type memhook_syscall_stub, @function
memhook_syscall_stub:
  syscall
  test %rax, %rax
  jnz 1f
  mov $231, %eax  // exit_group(0): the copy
  xor %edi, %edi
  syscall
1:
  mov memhook_ctl@GOTPCREL(%rip), %r12
  mov (%r12), %r12
  lea CTL_CALL_REGS(%r12), %r12
  mov %rax, CALL_RESULT_FROM_REGS(%r12)  // (a copy's PID: reaped later if memhook is gone)
  mov 19*8(%r12), %rsp  // rsp, less the red zone a leaf function may keep data in
  sub $128, %rsp
  push 16*8(%r12)       // rip: where ret returns to
  push 18*8(%r12)       // eflags
  push 3*8(%r12)        // r12
  mov 0*8(%r12), %r15
  mov 1*8(%r12), %r14
  mov 2*8(%r12), %r13
  mov 4*8(%r12), %rbp
  mov 5*8(%r12), %rbx
  mov 6*8(%r12), %r11
  mov 7*8(%r12), %r10
  mov 8*8(%r12), %r9
  mov 9*8(%r12), %r8
  mov 10*8(%r12), %rax
  mov 11*8(%r12), %rcx
  mov 12*8(%r12), %rdx
  mov 13*8(%r12), %rsi
  mov 14*8(%r12), %rdi
  movl $CALL_TAKEN, CALL_STATE_FROM_REGS(%r12)  // read: memhook may write the next call's
  pop %r12
  popfq
  ret $128              // and the red zone given back: rsp as it was
  .size memhook_syscall_stub, . - memhook_syscall_stub

  .section .note.GNU-stack, "", @progbits  // no executable stack
