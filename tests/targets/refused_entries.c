/* Allocation functions of the program's own that entry patching must refuse (issue 32):
 * pvalloc is three bytes long, shorter than the jump; valloc's loop branches back into its first
 * five bytes. Both are defined in the executable (entry_shapes in assembly, below), so no slot
 * reaches the calls main makes to them. Commands: "call" calls each, "exit". */
#include "harness.h"

void* valloc(size_t n);
void* pvalloc(size_t n);
__asm__(
    ".text\n"
    ".globl pvalloc\n.type pvalloc, @function\n"
    "pvalloc:\n  xor %eax, %eax\n  ret\n.size pvalloc, .-pvalloc\n"
    ".globl valloc\n.type valloc, @function\n"
    "valloc:\n  xor %ecx, %ecx\n1:\n  inc %ecx\n  cmp $3, %ecx\n  jne 1b\n"
    "  xor %eax, %eax\n  ret\n.size valloc, .-valloc\n");

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "call") && (valloc(100) || pvalloc(100))) return 1;
    harness_done();
  }
  return 0;
}
