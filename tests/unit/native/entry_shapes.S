// Functions of known shapes for the entry-patch planner (tests/unit/test_entry_patch.py).
  .text
  .globl framed
  .type framed, @function
framed:                      // push, mov, sub: 1 + 3 + 4 bytes
  push %rbp
  mov %rsp, %rbp
  sub $0x20, %rsp
  leave
  ret
  .size framed, .-framed

  .globl rip_relative
  .type rip_relative, @function
rip_relative:                // its first instruction reads memory relative to %rip
  mov table(%rip), %rax
  add %rdi, %rax
  ret
  .size rip_relative, .-rip_relative

  .globl loops_to_its_start
  .type loops_to_its_start, @function
loops_to_its_start:          // a branch back to +2, inside the first five bytes
  nop
  nop
1:
  dec %rdi
  jnz 1b
  ret
  .size loops_to_its_start, .-loops_to_its_start

  .globl unsized_loops_back
  .type unsized_loops_back, @function
unsized_loops_back:          // no .size: its call-frame entry says how long it is; its loop
  .cfi_startproc             // branches back to +2 from beyond the 32 bytes read without one
  nop
  nop
1:
  .fill 40, 1, 0x90
  dec %rdi
  jnz 1b
  ret
  .cfi_endproc

  .globl tiny
  .type tiny, @function
tiny:                        // three bytes
  xor %eax, %eax
  ret
  .size tiny, .-tiny

  .globl short_jump_first
  .type short_jump_first, @function
short_jump_first:            // a short conditional jump among the moved instructions
  test %rdi, %rdi
  je 2f
  mov $1, %eax
  ret
2:
  xor %eax, %eax
  ret
  .size short_jump_first, .-short_jump_first

  .data
table:
  .quad 42

  .text
  .globl hot_with_cold_part
  .type hot_with_cold_part, @function
hot_with_cold_part:          // its cold part (as GCC splits one off) jumps back to +3
  push %rbx
  test %rdi, %rdi
3:
  je hot_with_cold_part.cold
  pop %rbx
  ret
  .size hot_with_cold_part, .-hot_with_cold_part
  .type hot_with_cold_part.cold, @function
hot_with_cold_part.cold:
  xor %eax, %eax
  jmp 3b
  .size hot_with_cold_part.cold, .-hot_with_cold_part.cold
