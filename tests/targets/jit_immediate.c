/* Pointers a JIT keeps in the machine code it writes: an instruction's immediate, at any byte
 * (x86-64's movabs), in an anonymous mapping both writable and executable (HotSpot's code
 * cache). "all", from functions of their own:
 *   in_code:    a 1111-byte block whose only pointer is a movabs immediate at byte 4 of the
 *               code mapping: reachable;
 *   in_data:    a 1112-byte block whose only pointer lies at byte 3 of a writable mapping that
 *               is not executable: definitely lost (aligned words only, as valgrind reads);
 *   nowhere:    a 1113-byte block no pointer reaches: definitely lost. */
#include <stdint.h>
#include <sys/mman.h>
#include "harness.h"

static unsigned char* code;
static unsigned char* data;
static void* volatile sink;

NOINLINE static void in_code(void) {
  void* p = memset(malloc(1111), 0, 1111);
  code[2] = 0x48;  /* movabs $p, %rax: 48 b8 imm64 (the immediate at byte 4) */
  code[3] = 0xb8;
  memcpy(code + 4, &p, sizeof p);
  code[12] = 0xc3;  /* ret */
}
NOINLINE static void in_data(void) {
  void* p = memset(malloc(1112), 0, 1112);
  memcpy(data + 3, &p, sizeof p);
}
NOINLINE static void nowhere(void) { sink = memset(malloc(1113), 0, 1113); sink = NULL; }

int main(void) {
  char cmd[64];
  code = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  data = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (code == MAP_FAILED || data == MAP_FAILED) return 1;
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "all")) {
      in_code();
      in_data();
      nowhere();
    }
    harness_done();
  }
  return 0;
}
