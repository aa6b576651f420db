// memhook_hook_malloc, by hand.
#pragma once

// memhook_hook_malloc: full tracing's common case by hand. It has no frame of its own (its caller's
// frame pointer is still in %rbp, its return address at (%rsp)), and its record, when a stack
// slot holds the stack and the ring has room, keeps every value in the scratch registers a leaf
// may use freely (compiled, the record saved five more and spent a third more instructions).
// It calls the real malloc first and decides after it, in one compare of the session word with
// the thread's: a nested call (the guard set: operator new's malloc, or a signal handler's during
// a record) returns unrecorded, as framed_malloc would; anything else (no ring yet, no room, a
// slot that does not hold the stack, or memhook no longer tracing every call) goes to
// memhook_record_malloc, which decides again.
//
// Its dependency is the table entry's as found, without asking whose it is: when another
// pointer's, it names an earlier event (the entry was written before this hook read it), which
// costs the consumer at most a wait, and the consumer itself looks for a pending free of a block
// it still holds live (Consumer::free_pending in consumer.cpp).
static_assert(offsetof(ThreadState, write) == 0 && offsetof(ThreadState, lap_base) == 16 &&
              offsetof(ThreadState, ring) == 24 && offsetof(ThreadState, generation) == 56 &&
              offsetof(ThreadState, in_hook) == 60 && offsetof(ThreadState, stacks) == 64 &&
              offsetof(ThreadState, alloc_until) == 80 &&
              offsetof(ThreadState, entry_bias) == 88 && offsetof(ThreadState, last_slot) == 96 &&
              offsetof(RingHeader, write) == 8 && offsetof(StackCache, frame) == 0 &&
              offsetof(StackCache, ret0) == 8 && offsetof(StackCache, compare) == 24 &&
              offsetof(StackCache, slot_word) == 32 && offsetof(StackCache, pairs) == 64 &&
              kStackSlots == 32 && kPtrBits == 47 && kTagMask == 0x1fffff && kTableBits == 22 &&
              kDepShift == 24 && kAlignedPairs == 32 && kGolden32 == 0x9E3779B9 &&
              header(kAlloc, ID_malloc, 0, 0) == 0x101 && kEvery == 0 &&
              offsetof(Session, mode) == 4 && sizeof(ThreadState::in_hook) == 4,
              "memhook_hook_malloc reads these as constants");
asm(R"(
  # The record once the slot's stack compared equal (%xmm1 zero). In: %rax = p (returned as
  # is), %rsi = size, %rdx = the table tag, %r9 = the slot, %r10 = w, %r11 = the state.
  .macro memhook_malloc_record
  ptest %xmm1, %xmm1            # SSE4.1 (memhook_start checks)
  jnz memhook_compare_miss
  # header(kAlloc, malloc, 0 frames, dependency), pointer word, size word.
  movq %fs:16(%r11), %r8        # where it goes: %r8 + w
  movq %rax, 8(%r8,%r10)        # p: its depth bits are the slot's (segment.h)
  orq 32(%r9), %rsi
  movq %rsi, 16(%r8,%r10)       # size | (slot + 1) << 56 (a returned block's size is below 2^56)
  # The entry, then table_index(): this event becomes p's latest, the old one its dependency.
  movq %r10, %r9
  shlq $21, %r9
  addq %fs:88(%r11), %r9
  orq %rdx, %r9                 # table_entry(tag, kLive, this event)
  imull $0x9E3779B9, %edx, %edx
  movq %rax, %rcx
  shrq $4, %rcx
  xorq %rcx, %rdx
  andl $0x3fffff, %edx
  leaq memhook_table(%rip), %rcx
  movq (%rcx,%rdx,8), %rsi      # the old entry
  movq %r9, (%rcx,%rdx,8)
  andq $-0x1000000, %rsi
  orq $0x101, %rsi
  movq %rsi, (%r8,%r10)
  addq $24, %r10
  movq %r10, %fs:0(%r11)
  movq %fs:24(%r11), %rcx
  movq %r10, 8(%rcx)            # published
  movq %rdi, %fs:56(%r11)       # the guard cleared, as an 8-byte store the next compare reads
  ret
  .endm

  .text
  .globl memhook_hook_malloc
  .type memhook_hook_malloc, @function
  .p2align 6                    # its entry and checks in one fetch line
memhook_hook_malloc:
  .cfi_startproc
  pushq %rdi                    # the size, and the stack aligned for the call
  .cfi_adjust_cfa_offset 8
  call *memhook_g_real+8(%rip)
  popq %rsi
  .cfi_adjust_cfa_offset -8
  testq %rax, %rax
  je 7f
  movq memhook_t_state@gottpoff(%rip), %r11
  movq memhook_session(%rip), %rdi
  cmpq %fs:56(%r11), %rdi       # tracing every call, this session's ring claimed, the guard clear
  jne 6f                        # (and the same 8 bytes clear the guard at the end)
  movl $1, %fs:60(%r11)         # the guard, before the cursor is read
  movq %fs:0(%r11), %r10        # w
  cmpq %fs:80(%r11), %r10
  jae memhook_compare_miss      # no room without a look at the consumer
  movq %rax, %rdx
  shrq $26, %rdx                # the table tag, below 2^21 for a user-space pointer
  cmpq $0x200000, %rdx
  jae memhook_compare_miss
  movq (%rsp), %r8              # ret0
  movq %fs:96(%r11), %r9        # the slot of this thread's latest allocation first
  cmpq %rbp, (%r9)
  jne 5f
  cmpq %r8, 8(%r9)
  jne 5f
4:
  pxor %xmm1, %xmm1
  movq %rbp, %rcx               # f_1
  jmp *24(%r9)
  # Step j: xmm1 |= f[0..1] ^ pairs[j]; f = pairs[j].next (same_stack()). The pair is loaded once
  # and the next frame taken from its register: loads are what this loop runs short of.
  .macro memhook_step_avx512 pair
  vmovdqu (%rcx), %xmm0
  {disp32} vmovdqa \pair(%r9), %xmm3
  vmovq %xmm3, %rcx
  vpternlogq $0xf6, %xmm3, %xmm0, %xmm1
  .endm
  .macro memhook_step_sse pair
  movdqu (%rcx), %xmm0
  {disp32} movdqa \pair(%r9), %xmm3
  movq %xmm3, %rcx
  pxor %xmm3, %xmm0
  por %xmm0, %xmm1
  .endm
  # Steps 0..30 at `first`, equal in size, then step 31 at `last`, which follows no pointer.
  .macro memhook_compare_steps first, last, step, bytes
\first:
  .set pair, 0
  .rept 31
  \step 64+16*pair
  .set pair, pair + 1
  .endr
\last:
  .if \last - \first - 31 * \bytes
  .error "the comparison's steps differ in size"
  .endif
  .endm
  memhook_compare_steps memhook_compare_avx512, memhook_compare_avx512_last, memhook_step_avx512, 25
  vmovdqu (%rcx), %xmm0
  vpternlogq $0xf6, 64+16*31(%r9), %xmm0, %xmm1
  memhook_malloc_record
  memhook_compare_steps memhook_compare_sse, memhook_compare_sse_last, memhook_step_sse, 26
  movdqu (%rcx), %xmm0
  pxor 64+16*31(%r9), %xmm0
  por %xmm0, %xmm1
  memhook_malloc_record
6:
  cmpl $0, %fs:60(%r11)
  jne 7f                        # nested (a hook's own call, or a handler during a record)
  jmp memhook_compare_miss      # no ring yet
5:
  movq %rsp, %r9
  xorq %r8, %r9
  imull $0x9E3779B9, %r9d, %r9d
  shrl $27, %r9d                # the stack slot (stack_slot())
  imull memhook_g_stack_stride(%rip), %r9d
  addq %fs:64(%r11), %r9        # its StackCache
  cmpq %rbp, (%r9)
  jne memhook_compare_miss
  cmpq %r8, 8(%r9)
  jne memhook_compare_miss
  movq %r9, %fs:96(%r11)        # last_slot
  jmp 4b
memhook_compare_miss:
  movq %rax, %rdi
  movq %rsp, %rdx               # where the return address is
  movq %rbp, %rcx               # the caller's frame
  jmp memhook_record_malloc     # returns p
7:
  ret
  .cfi_endproc
  .size memhook_hook_malloc, .-memhook_hook_malloc
  .hidden memhook_compare_avx512
  .hidden memhook_compare_avx512_last
  .hidden memhook_compare_sse
  .hidden memhook_compare_sse_last
  .hidden memhook_compare_miss
  .globl memhook_compare_avx512
  .globl memhook_compare_avx512_last
  .globl memhook_compare_sse
  .globl memhook_compare_sse_last
  .globl memhook_compare_miss
)");
