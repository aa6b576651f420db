// AArch64 functions whose first instruction reads the PC (or is a landing pad), for the entry
// planner's relocation (memhook/entry_patch/a64.py; tests/unit/test_entry_patch.py): each is
// called once directly and once through the trampoline the planner wrote, under qemu-user
// (entry_harness_a64.c), and must return the same. x0 in, x0 out.
  .text
  .p2align 4
  .globl shape_adrp
shape_adrp:               // ADRP: a page address
  adrp x1, value
  add x1, x1, :lo12:value
  ldr x0, [x1]
  ret

  .globl shape_adr
shape_adr:                // ADR: an address near the PC
  adr x1, near_value
  ldr x0, [x1]
  ret
near_value:
  .quad 0x1122334455667788

  .globl shape_ldr
shape_ldr:                // LDR Xt, literal
  ldr x0, literal
  ret
  .p2align 3
literal:
  .quad 0x0123456789abcdef

  .globl shape_ldrsw
shape_ldrsw:              // LDRSW Xt, literal: sign-extended
  ldrsw x0, literal32
  ret
literal32:
  .word -12345

  .globl shape_ldr_w
shape_ldr_w:              // LDR Wt, literal
  ldr w0, literal32
  ret

  .globl shape_ldr_d
shape_ldr_d:              // LDR Dt, literal (through x17)
  ldr d0, literal
  fmov x0, d0
  ret

  .globl shape_b
shape_b:                  // B: a tail call
  b far_target

  .globl shape_cbz
shape_cbz:                // CBZ: 2 for zero, else 1
  cbz x0, 1f
  mov x0, #1
  ret
1:
  mov x0, #2
  ret

  .globl shape_tbnz
shape_tbnz:               // TBNZ: bit 3 set -> 4, else 3
  tbnz x0, #3, 1f
  mov x0, #3
  ret
1:
  mov x0, #4
  ret

  .globl shape_bcond
shape_bcond:              // B.cond on flags set by the caller's cmp: eq -> 6, else 5
  b.eq 1f
  mov x0, #5
  ret
1:
  mov x0, #6
  ret

  .globl shape_plain
shape_plain:              // nothing PC-relative: copied as it is
  add x0, x0, #5
  ret

  .globl shape_pac
shape_pac:                // a signing landing pad stays; the next instruction moves
  paciasp
  stp x29, x30, [sp, #-16]!
  mov x29, sp
  add x0, x0, #9
  ldp x29, x30, [sp], #16
  autiasp
  ret

  .globl shape_bti
shape_bti:                // a BTI landing pad stays; the ADRP after it moves
  bti c
  adrp x1, value
  add x1, x1, :lo12:value
  ldr x0, [x1]
  ret

  .globl shape_loop
shape_loop:               // branches back to its second instruction: refused after a pad
  bti c
1:
  subs x0, x0, #1
  b.ne 1b
  ret

  .p2align 4
far_target:
  mov x0, #77
  ret

  .data
  .p2align 3
value:
  .quad 0x5555aaaa5555aaaa
  .section .note.GNU-stack, "", @progbits
