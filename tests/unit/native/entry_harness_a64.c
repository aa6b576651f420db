// Runs the AArch64 entry planner's trampolines (tests/unit/test_entry_patch.py): argv[1] is a
// file of lines "name cell hex" (a trampoline planned for function `name` at address `cell`).
// Each is copied to its cell, then every function is called directly and through its
// trampoline with the same argument (and flags, for B.cond); prints "name direct trampoline".
// Static and non-PIE: the functions' addresses are the planner's.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SHAPES(X) X(adrp) X(adr) X(ldr) X(ldrsw) X(ldr_w) X(ldr_d) X(b) X(cbz) X(tbnz) \
  X(bcond) X(plain) X(pac) X(bti)
#define DECLARE(n) uint64_t shape_##n(uint64_t);
SHAPES(DECLARE)

// Calls f(arg) with the Z flag set as `eq` says (what shape_bcond reads).
static uint64_t call(uint64_t (*f)(uint64_t), uint64_t arg, int eq) {
  register uint64_t x0 asm("x0") = arg;
  register uint64_t fn asm("x9") = (uint64_t)f;
  asm volatile("cmp %2, #1\n\tblr %1"
               : "+r"(x0)
               : "r"(fn), "r"((uint64_t)eq)
               : "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x10", "x11", "x12", "x13",
                 "x14", "x15", "x16", "x17", "x30", "v0", "cc", "memory");
  return x0;
}

int main(int argc, char** argv) {
  FILE* f = fopen(argv[1], "r");
  char name[64], hex[512];
  unsigned long long cell;
  const uint64_t area = 0x4000000;
  if (mmap((void*)area, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
           -1, 0) != (void*)area)
    return 2;
  struct { const char* name; uint64_t (*f)(uint64_t); uint64_t (*t)(uint64_t); } shapes[] = {
#define ENTRY(n) {#n, shape_##n, 0},
      SHAPES(ENTRY)};
  while (f && fscanf(f, "%63s %llx %511s", name, &cell, hex) == 3) {
    uint8_t* at = (uint8_t*)cell;
    for (size_t i = 0; hex[2 * i]; i++) sscanf(hex + 2 * i, "%2hhx", at + i);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
      if (!strcmp(shapes[i].name, name)) shapes[i].t = (uint64_t(*)(uint64_t))at;
  }
  __builtin___clear_cache((char*)area, (char*)area + (1 << 20));
  mprotect((void*)area, 1 << 20, PROT_READ | PROT_EXEC);
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    if (!shapes[i].t) continue;
    for (uint64_t arg = 0; arg < 10; arg += 8)
      for (int eq = 0; eq < 2; eq++)
        printf("%s %llx %llx\n", shapes[i].name, (unsigned long long)call(shapes[i].f, arg, eq),
               (unsigned long long)call(shapes[i].t, arg, eq));
  }
  return 0;
}
