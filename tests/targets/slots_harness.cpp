// The slots' rules (hook_library/slots.h) in-process: a plan of five "GOT" slots in this
// program's own memory is patched by memhook_patch() and put back by memhook_stop(), as at
// attach and detach. Prints each slot's state and value after each step.
//   slots_harness LIBRARY SEGMENT
#include "load_hook_library.h"

alignas(4096) static uint64_t got[512];           // a writable page of slots
alignas(4096) static uint64_t got_ro[512];        // made read-only, as RELRO is
static uint64_t* gone;                            // a slot in a page unmapped before attach
constexpr uint64_t kLazyLo = 0x10000, kLazyHi = 0x20000;  // a stand-in PLT

static void plan(memhook::Control* c) {
  uint64_t* slots[] = {&got[0], &got[1], &got[2], gone, &got_ro[0]};
  for (int i = 0; i < 5; i++) {
    c->slots[i] = memhook::PatchedSlot{(uint64_t)slots[i], (uint64_t)&malloc, 0, 1,
                                       (uint16_t)memhook::kSlotPlanned, (uint16_t)(i == 4)};
    c->lazy[i] = memhook::LazyRange{kLazyLo, kLazyHi};
  }
  c->nslots = 5;
}

static void show(const char* step, void* lib) {
  auto* c = *(memhook::Control**)dlsym(lib, "memhook_ctl");
  for (uint32_t i = 0; i < c->nslots; i++) {
    const memhook::PatchedSlot& s = c->slots[i];
    const bool mapped = i != 3;
    printf("%s %u state %u value %#lx original %#lx\n", step, i, s.state,
           mapped ? (unsigned long)*(uint64_t*)s.addr : 0ul, (unsigned long)s.original);
  }
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  got[0] = (uint64_t)&malloc;           // bound: the real function
  got[1] = kLazyLo + 0x30;              // lazy: still in the PLT
  got[2] = 0xdead0000;                  // someone else's hook: left alone
  got_ro[0] = (uint64_t)&malloc;
  mprotect(got_ro, 4096, PROT_READ);
  gone = (uint64_t*)mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  munmap(gone, 4096);
  void* lib = load_hook_library(argv[1], argv[2], plan);
  if (!lib) return 4;
  printf("hook %#lx malloc %#lx\n", (unsigned long)dlsym(lib, "memhook_hook_malloc"),
         (unsigned long)&malloc);
  printf("patch %d\n", ((int (*)())dlsym(lib, "memhook_patch"))());
  show("patched", lib);
  got[1] = 0x1234;  // the program writes a patched slot: detach must leave it so
  printf("stop %d\n", ((int (*)())dlsym(lib, "memhook_stop"))());
  show("stopped", lib);
  fflush(stdout);
  return 0;
}
