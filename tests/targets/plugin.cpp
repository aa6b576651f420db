// Loaded by lifecycle.c after memhook attached; brings libstdc++ with it.
#include <cstdlib>
#include <cstring>
#include <new>
#define NOINLINE __attribute__((noinline))

// Initialised data pointing at malloc: an absolute relocation in this PIC library
// (R_X86_64_64, R_AARCH64_ABS64).
void* (*volatile table_alloc)(size_t) = malloc;

NOINLINE void plugin_leak_new() { for (int i = 0; i < 8; i++) memset(::operator new(777), 1, 1); }
NOINLINE void plugin_leak_malloc() { for (int i = 0; i < 12; i++) memset(malloc(555), 1, 1); }
NOINLINE void plugin_leak_table() { for (int i = 0; i < 5; i++) memset(table_alloc(333), 1, 1); }

extern "C" void plugin_work() {
  plugin_leak_new();
  plugin_leak_malloc();
  plugin_leak_table();
}
