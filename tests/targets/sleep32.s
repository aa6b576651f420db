# A 32-bit (i386) program that sleeps in a loop, built with binutils alone (as --32, ld -m
# elf_i386): memhook must refuse it with a clear message.
        .globl _start
        .text
_start:
        movl $162, %eax          # nanosleep
        movl $ts, %ebx
        xorl %ecx, %ecx
        int $0x80
        jmp _start
        .data
ts:     .long 1, 0
