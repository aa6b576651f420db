// memhook_hook_malloc, by hand: the entry a full-tracing session points malloc's slots at.
//
// The same entry as arch/x86_64/malloc_entry.S, in AArch64's terms. `bl` leaves the return
// address in x30, which the real call clobbers, so this entry keeps a 32-byte frame of its own:
// the frame record (the caller's x29, then x30: the call site, ret0) and the size. Its record,
// when a recent stack matches and the ring has room, uses only the scratch registers x0-x17
// (no x18: the platform register). It calls the real malloc first and decides after it, in one
// compare of the session word with the thread's: a nested call (the guard set) returns
// unrecorded; anything else (no ring yet, no room, a recent stack that does not match, memhook
// no longer tracing every call) calls memhook_record_malloc, which decides again. That call
// keeps this frame: the walk reads the call site where this entry stored it (Origin.ret, the
// recent stacks' key with the caller's x29 and ret0).
//
// The dependency is the table entry's as found, as on x86-64. The record is published with a
// release store (stlr): the consumer on another core must see its words and the table entry
// before the cursor that covers them.
//
// Constants and offsets come from asm_offsets.h (hook_library/asm_offsets.cpp).
#include "asm_offsets.h"

  // x11 = this thread's ThreadState: the block's offset from TPIDR_EL0, by initial-exec TLS, or
  // in the musl build (musl refuses initial-exec TLS in a library dlopen loads) by the TLS
  // descriptor's call, which returns it in x0 and clobbers only x0 and x30 (musl's
  // __tlsdesc_static and __tlsdesc_dynamic; x30 is in this entry's frame record). x12 is free
  // here. No relaxation in a shared library: the call may go through x16.
  .macro memhook_thread_state
#ifdef MEMHOOK_MUSL
  mov x12, x0                   // p, kept
  adrp x0, :tlsdesc:memhook_t_state
  ldr x16, [x0, #:tlsdesc_lo12:memhook_t_state]
  add x0, x0, #:tlsdesc_lo12:memhook_t_state
  .tlsdesccall memhook_t_state
  blr x16
  mrs x11, tpidr_el0
  add x11, x11, x0
  mov x0, x12
#else
  adrp x11, :gottprel:memhook_t_state
  ldr x11, [x11, #:gottprel_lo12:memhook_t_state]
  mrs x12, tpidr_el0
  add x11, x11, x12
#endif
  .endm

  .macro memhook_golden reg
  movz \reg, #(GOLDEN32 & 0xffff)
  movk \reg, #(GOLDEN32 >> 16), lsl #16
  .endm

  .text
  .globl memhook_hook_malloc
  .type memhook_hook_malloc, %function
  .p2align 6                    // its entry and checks in one fetch block
memhook_hook_malloc:
  .cfi_startproc
  stp x29, x30, [sp, #-32]!     // the frame record: [sp] the caller's x29, [sp + 8] ret0
  .cfi_def_cfa_offset 32
  .cfi_offset 29, -32
  .cfi_offset 30, -24
  mov x29, sp                   // a frame-pointer walk (perf, gdb) inside malloc sees the caller
  str x0, [sp, #16]             // the size
  adrp x16, memhook_g_real + REAL_MALLOC
  ldr x16, [x16, #:lo12:memhook_g_real + REAL_MALLOC]
  blr x16
  cbz x0, 7f
  ldr x1, [sp, #16]             // size
  ldp x2, x3, [sp]              // the caller's x29 (its frame), ret0
  add x4, sp, #8                // where ret0 is (Origin.ret): the recent stacks' key
  memhook_thread_state
  adrp x17, memhook_session
  ldr x17, [x17, #:lo12:memhook_session]   // (generation, mode)
  ldr x12, [x11, #TS_GENERATION]           // (generation, guard)
  cmp x17, x12                  // tracing every call, this session's ring claimed, the guard clear
  b.ne 6f                       // (and storing x17 there clears the guard at the end)
  mov w12, #1
  str w12, [x11, #TS_GUARD]     // the guard, before the cursor is read
  ldr x10, [x11, #TS_WRITE]     // w
  ldr x12, [x11, #TS_ALLOC_UNTIL]
  cmp x10, x12
  b.hs memhook_compare_miss     // no room without a look at the consumer
  ldr x9, [x11, #TS_LAST_RECENT]   // the recent stack of this thread's latest allocation first
  ldp x12, x13, [x9, #RS_FRAME]    // frame, ret0
  ldr x14, [x9, #RS_SP]
  cmp x12, x2
  b.ne 3f
2:
  cmp x13, x3
  b.ne 5f
  cmp x14, x4
  b.ne 5f
4:
  mov x6, #0                    // the steps' difference
  mov x5, x2                    // f_1
  add x7, x9, #RS_STEPS
  add x8, x9, #RS_PAIRS
  ldr x16, [x9, #RS_COMPARE]
  br x16
  // Word step j: x6 |= *steps[j].addr ^ steps[j].value (same_stack()): the words a walk read
  // past its leading frame records, each where it was read. Every step has the same size.
  .macro memhook_word_step word
  ldp x12, x13, [x7, #16 * \word]
  ldr x12, [x12]
  eor x12, x12, x13
  orr x6, x6, x12
  .endm
memhook_compare_words:
  .set word, 0
  .rept ALIGNED_STEPS
  memhook_word_step word
  .set word, word + 1
  .endr
memhook_compare_words_end:
  .if memhook_compare_words_end - memhook_compare_words - ALIGNED_STEPS * 16
  .error "the word steps differ in size"
  .endif
  ldr x16, [x9, #RS_PAIRS_COMPARE]   // then the pairs, if any
  br x16
  // Pair step j: x6 |= f[0..1] ^ pairs[j]; f = pairs[j].next (same_stack()). The next frame is
  // taken from the pair as kept, not from the stack: no load waits for the one before it.
  .macro memhook_pair_step pair
  ldp x12, x13, [x5]
  ldp x5, x14, [x8, #16 * \pair]
  eor x12, x12, x5
  eor x13, x13, x14
  orr x6, x6, x12
  orr x6, x6, x13
  .endm
memhook_compare_pairs:
  .set pair, 0
  .rept ALIGNED_PAIRS-1
  memhook_pair_step pair
  .set pair, pair + 1
  .endr
memhook_compare_pairs_last:
  .if memhook_compare_pairs_last - memhook_compare_pairs - (ALIGNED_PAIRS-1) * 24
  .error "the comparison's steps differ in size"
  .endif
  memhook_pair_step (ALIGNED_PAIRS-1)   // (its next frame goes unused)
memhook_compare_done:
  cbnz x6, memhook_compare_miss
  // header(kAlloc, malloc, 0 frames, dependency), pointer word, size word.
  ldr x12, [x11, #TS_LAP_BASE]
  add x12, x12, x10             // where it goes
  ldr x13, [x9, #RS_SIZE_BITS]
  orr x13, x1, x13              // size | (entry + 1) << 56 (a returned block's size is below 2^56)
  and x14, x0, #PTR_MASK        // p without a top-byte tag: its depth bits are the recent stack's
  stp x14, x13, [x12, #8]
  // The entry, then table_index(): this event becomes p's latest, the old one its dependency.
  lsr x13, x0, #TABLE_TAG_SHIFT   // the tag (its low 32 bits hashed, TABLE_TAG_MASK kept)
  ldr x14, [x11, #TS_ENTRY_BIAS]
  add x14, x14, x10, lsl #ENTRY_CURSOR_SHIFT
  and x15, x13, #TABLE_TAG_MASK
  orr x14, x14, x15             // table_entry(tag, kLive, this event)
  memhook_golden w15
  mul w13, w13, w15
  eor x13, x13, x0, lsr #TABLE_GRANULE_SHIFT
  and x13, x13, #TABLE_INDEX_MASK
  adrp x15, memhook_table
  add x15, x15, #:lo12:memhook_table
  ldr x16, [x15, x13, lsl #3]   // the old entry
  str x14, [x15, x13, lsl #3]
  and x16, x16, #HEADER_DEP_MASK
  mov x13, #MALLOC_HEADER
  orr x16, x16, x13
  str x16, [x12]
  add x10, x10, #ALLOC_RECORD_BYTES
  str x10, [x11, #TS_WRITE]
  ldr x13, [x11, #TS_RING]
  add x13, x13, #RING_WRITE
  stlr x10, [x13]               // published, after every word of it
  str x17, [x11, #TS_GENERATION]   // the guard cleared, as the 8-byte word the next compare reads
  .cfi_remember_state
  ldp x29, x30, [sp], #32
  .cfi_restore 29
  .cfi_restore 30
  .cfi_def_cfa_offset 0
  ret
  .cfi_restore_state
3:
  ldr w12, [x9, #RS_FRAME_USED]    // x29 differs: no matter if the walk did not use it (segment.h)
  cbz w12, 2b
  b 5f
6:
  ldr w12, [x11, #TS_GUARD]
  cbnz w12, 7f                  // nested (a hook's own call, or a handler during a record)
  b memhook_compare_miss        // no ring yet
5:
  eor x13, x3, x4
  memhook_golden w15
  mul w13, w13, w15
  lsr w13, w13, #RECENT_STACK_SHIFT   // the recent stack (recent_stack_for())
  adrp x15, memhook_recent_stride
  ldr w15, [x15, #:lo12:memhook_recent_stride]
  mul w13, w13, w15
  ldr x9, [x11, #TS_RECENT]
  add x9, x9, x13               // its RecentStack
  ldp x12, x13, [x9, #RS_FRAME]
  ldr x14, [x9, #RS_SP]
  cmp x12, x2
  b.ne 8f
9:
  cmp x13, x3
  b.ne memhook_compare_miss
  cmp x14, x4
  b.ne memhook_compare_miss
  str x9, [x11, #TS_LAST_RECENT]
  b 4b
8:
  ldr w12, [x9, #RS_FRAME_USED]
  cbz w12, 9b
memhook_compare_miss:
  // memhook_record_malloc(p, size, where ret0 is, the caller's frame, the caller's sp), called
  // with this frame kept: ret0 stays where x4 says.
  mov x3, x2
  mov x2, x4
  add x4, sp, #32
  bl memhook_record_malloc      // returns p
7:
  ldp x29, x30, [sp], #32
  .cfi_restore 29
  .cfi_restore 30
  .cfi_def_cfa_offset 0
  ret
  .cfi_endproc
  .size memhook_hook_malloc, .-memhook_hook_malloc
  .hidden memhook_compare_pairs
  .hidden memhook_compare_pairs_last
  .hidden memhook_compare_miss
  .hidden memhook_compare_words
  .hidden memhook_compare_words_end
  .hidden memhook_compare_done
  .globl memhook_compare_pairs
  .globl memhook_compare_pairs_last
  .globl memhook_compare_miss
  .globl memhook_compare_words
  .globl memhook_compare_words_end
  .globl memhook_compare_done

  .section .note.GNU-stack, "", %progbits  // no executable stack
