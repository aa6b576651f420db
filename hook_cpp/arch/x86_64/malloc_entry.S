// memhook_hook_malloc, by hand: the entry a full-tracing session points malloc's slots at.
//
// memhook_hook_malloc: full tracing's common case by hand. It has no frame of its own (its caller's
// frame pointer is still in %rbp, its return address at (%rsp)), and its record, when a recent
// stack matches and the ring has room, keeps every value in the scratch registers a leaf
// may use freely (compiled, the record saved five more and spent a third more instructions).
// It calls the real malloc first and decides after it, in one compare of the session word with
// the thread's: a nested call (the guard set: operator new's malloc, or a signal handler's during
// a record) returns unrecorded, as fast_malloc would; anything else (no ring yet, no room, a
// recent stack that does not match, or memhook no longer tracing every call) goes to
// memhook_record_malloc, which decides again.
//
// Its dependency is the table entry's as found, without asking whose it is: when another
// pointer's, it names an earlier event (the entry was written before this hook read it), which
// costs the consumer at most a wait, and the consumer itself looks for a pending free of a block
// it still holds live (RingReader::free_pending, consumer/ring_reader.h).
//
// Constants and offsets come from asm_offsets.h, generated from the C++ definitions
// (asm_offsets.cpp, which also checks what the code below assumes of them).
#include "asm_offsets.h"

  // The record once the recent stack compared equal (%xmm1 zero). In: %rax = p (returned as
  // is), %rsi = size, %rdx = the table tag, %r9 = the recent stack, %r10 = w, %r11 = the state.
  .macro memhook_malloc_record
  ptest %xmm1, %xmm1            // SSE4.1 (memhook_start checks)
  jnz memhook_compare_miss
  // header(kAlloc, malloc, 0 frames, dependency), pointer word, size word.
  movq %fs:TS_LAP_BASE(%r11), %r8        // where it goes: %r8 + w
  movq %rax, 8(%r8,%r10)        // p: its depth bits are the recent stack's (segment.h)
  orq RS_SIZE_BITS(%r9), %rsi
  movq %rsi, 16(%r8,%r10)       // size | (entry + 1) << 56 (a returned block's size is below 2^56)
  // The entry, then table_index(): this event becomes p's latest, the old one its dependency.
  movq %r10, %r9
  shlq $ENTRY_CURSOR_SHIFT, %r9
  addq %fs:TS_ENTRY_BIAS(%r11), %r9
  orq %rdx, %r9                 // table_entry(tag, kLive, this event)
  imull $GOLDEN32, %edx, %edx
  movq %rax, %rcx
  shrq $TABLE_GRANULE_SHIFT, %rcx
  xorq %rcx, %rdx
  andl $TABLE_INDEX_MASK, %edx
  leaq memhook_table(%rip), %rcx
  movq (%rcx,%rdx,8), %rsi      // the old entry
  movq %r9, (%rcx,%rdx,8)
  andq $HEADER_DEP_MASK, %rsi
  orq $MALLOC_HEADER, %rsi
  movq %rsi, (%r8,%r10)
  addq $ALLOC_RECORD_BYTES, %r10
  movq %r10, %fs:TS_WRITE(%r11)
  movq %fs:TS_RING(%r11), %rcx
  movq %r10, RING_WRITE(%rcx)            // published
  movq %rdi, %fs:TS_GENERATION(%r11)       // the guard cleared, as an 8-byte store the next compare reads
  ret
  .endm

  .text
  .globl memhook_hook_malloc
  .type memhook_hook_malloc, @function
  .p2align 6                    // its entry and checks in one fetch line
memhook_hook_malloc:
  .cfi_startproc
  pushq %rdi                    // the size, and the stack aligned for the call
  .cfi_adjust_cfa_offset 8
  call *memhook_g_real+REAL_MALLOC(%rip)
  popq %rsi
  .cfi_adjust_cfa_offset -8
  testq %rax, %rax
  je 7f
#ifdef MEMHOOK_MUSL
  movq %rax, %rcx               // p, kept: the TLS descriptor's call returns in %rax alone
  leaq memhook_t_state@tlsdesc(%rip), %rax
  call *memhook_t_state@tlscall(%rax)
  movq %rax, %r11               // the state's offset from %fs, as initial-exec's load gives it
  movq %rcx, %rax
#else
  movq memhook_t_state@gottpoff(%rip), %r11
#endif
  movq memhook_session(%rip), %rdi
  cmpq %fs:TS_GENERATION(%r11), %rdi       // tracing every call, this session's ring claimed, the guard clear
  jne 6f                        // (and the same 8 bytes clear the guard at the end)
  movl $1, %fs:TS_GUARD(%r11)         // the guard, before the cursor is read
  movq %fs:TS_WRITE(%r11), %r10        // w
  cmpq %fs:TS_ALLOC_UNTIL(%r11), %r10
  jae memhook_compare_miss      // no room without a look at the consumer
  movq %rax, %rdx
  shrq $TABLE_TAG_SHIFT, %rdx                // the table tag, below 2^21 for a user-space pointer
  cmpq $TABLE_TAG_LIMIT, %rdx
  jae memhook_compare_miss
  movq (%rsp), %r8              // ret0
  movq %fs:TS_LAST_RECENT(%r11), %r9        // the recent stack of this thread's latest allocation first
  cmpq %rbp, RS_FRAME(%r9)
  jne 3f
2:
  cmpq %r8, RS_RET0(%r9)
  jne 5f
  cmpq %rsp, RS_SP(%r9)
  jne 5f
4:
  pxor %xmm1, %xmm1
  xorl %r8d, %r8d               // the word steps' difference
  movq %rbp, %rcx               // f_1
  jmp *RS_COMPARE(%r9)
  // Word step j: %r8 |= *steps[j].addr ^ steps[j].value (same_stack()): the words a walk read
  // past its leading frame-pointer frames, each where it was read. Every step has the same size.
  .macro memhook_word_step word
  {disp32} movq \word(%r9), %rcx
  movq (%rcx), %rcx
  {disp32} xorq \word+8(%r9), %rcx
  orq %rcx, %r8
  .endm
memhook_compare_words:
  .set word, 0
  .rept ALIGNED_STEPS
  memhook_word_step RS_STEPS+16*word
  .set word, word + 1
  .endr
memhook_compare_words_end:
  .if memhook_compare_words_end - memhook_compare_words - ALIGNED_STEPS * 20
  .error "the word steps differ in size"
  .endif
  movq %r8, %xmm1
  movq %rbp, %rcx
  jmp *RS_PAIRS_COMPARE(%r9)    // then the pairs, if any
  // Pair step j: xmm1 |= f[0..1] ^ pairs[j]; f = pairs[j].next (same_stack()). The pair is loaded
  // once and the next frame taken from its register: loads are what this loop runs short of.
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
  // Steps 0..30 at `first`, equal in size, then step 31 at `last`, which follows no pointer.
  .macro memhook_compare_steps first, last, step, bytes
\first:
  .set pair, 0
  .rept ALIGNED_PAIRS-1
  \step RS_PAIRS+16*pair
  .set pair, pair + 1
  .endr
\last:
  .if \last - \first - (ALIGNED_PAIRS-1) * \bytes
  .error "the comparison's steps differ in size"
  .endif
  .endm
  memhook_compare_steps memhook_compare_avx512, memhook_compare_avx512_last, memhook_step_avx512, 25
  vmovdqu (%rcx), %xmm0
  vpternlogq $0xf6, RS_PAIRS+16*(ALIGNED_PAIRS-1)(%r9), %xmm0, %xmm1
  // The VEX/EVEX steps leave this CPU's upper register state dirty: every legacy SSE
  // instruction after them (ptest below, the next call's pxor, the target's own SSE code) then
  // paid a transition. Into a static jemalloc: 183 ns per malloc, 22.5 with this
  // (benchmarks/README.md, fourth session).
  vzeroupper
  jmp memhook_compare_done
  memhook_compare_steps memhook_compare_sse, memhook_compare_sse_last, memhook_step_sse, 26
  movdqu (%rcx), %xmm0
  pxor RS_PAIRS+16*(ALIGNED_PAIRS-1)(%r9), %xmm0
  por %xmm0, %xmm1
memhook_compare_done:
  memhook_malloc_record
3:
  cmpl $0, RS_FRAME_USED(%r9)   // rbp differs: no matter if the walk did not use it (segment.h)
  je 2b
  jmp 5f
6:
  cmpl $0, %fs:TS_GUARD(%r11)
  jne 7f                        // nested (a hook's own call, or a handler during a record)
  jmp memhook_compare_miss      // no ring yet
5:
  movq %rsp, %r9
  xorq %r8, %r9
  imull $GOLDEN32, %r9d, %r9d
  shrl $RECENT_STACK_SHIFT, %r9d                // the recent stack (recent_stack_for())
  imull memhook_recent_stride(%rip), %r9d
  addq %fs:TS_RECENT(%r11), %r9        // its RecentStack
  cmpq %rbp, RS_FRAME(%r9)
  jne 8f
9:
  cmpq %r8, RS_RET0(%r9)
  jne memhook_compare_miss
  cmpq %rsp, RS_SP(%r9)
  jne memhook_compare_miss
  movq %r9, %fs:TS_LAST_RECENT(%r11)        // last_recent
  jmp 4b
8:
  cmpl $0, RS_FRAME_USED(%r9)
  je 9b
  jmp memhook_compare_miss
memhook_compare_miss:
  movq %rax, %rdi
  movq %rsp, %rdx               // where the return address is
  movq %rbp, %rcx               // the caller's frame
  jmp memhook_record_malloc     // returns p
7:
  ret
  .cfi_endproc
  .size memhook_hook_malloc, .-memhook_hook_malloc
  .hidden memhook_compare_avx512
  .hidden memhook_compare_avx512_last
  .hidden memhook_compare_sse
  .hidden memhook_compare_sse_last
  .hidden memhook_compare_miss
  .hidden memhook_compare_words
  .hidden memhook_compare_words_end
  .hidden memhook_compare_done
  .globl memhook_compare_avx512
  .globl memhook_compare_avx512_last
  .globl memhook_compare_sse
  .globl memhook_compare_sse_last
  .globl memhook_compare_miss
  .globl memhook_compare_words
  .globl memhook_compare_words_end
  .globl memhook_compare_done

  .section .note.GNU-stack, "", @progbits  // no executable stack
