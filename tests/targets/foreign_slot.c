/* Another tool got here first: the executable's GOT entry for malloc is redirected to a
 * wrapper before memhook attaches. memhook must leave that slot alone (and say so) while
 * hooking everything else. Built with -fno-plt so calls go through that GOT entry. */
#include <stdint.h>
#include <sys/mman.h>
#include "harness.h"

extern void* __libc_malloc(size_t);
static long wrapped;
static void* wrapper(size_t n) { wrapped++; return __libc_malloc(n); }

static void** malloc_slot(void) {
  void** slot;
  __asm__("leaq malloc@GOTPCREL(%%rip), %0" : "=r"(slot));
  return slot;
}

NOINLINE static void through_wrapper(void) { for (int i = 0; i < 5; i++) memset(malloc(123), 1, 1); }
NOINLINE static void through_calloc(void) { for (int i = 0; i < 3; i++) memset(calloc(1, 456), 1, 1); }

int main(void) {
  char cmd[64];
  void** slot = malloc_slot();
  uintptr_t page = (uintptr_t)slot & ~(uintptr_t)4095;
  mprotect((void*)page, 4096, PROT_READ | PROT_WRITE);
  *slot = (void*)wrapper;
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "go")) { through_wrapper(); through_calloc(); }
    if (!strcmp(cmd, "check")) printf("slot %s wrapped %ld\n", *slot == (void*)wrapper ? "ours" : "changed", wrapped);
    harness_done();
  }
  return 0;
}
