/* A shared library whose constructor allocates (memhook run must see it): 1111 bytes kept. */
#include <stdlib.h>
#include <string.h>

void* lib_ctor_block;

__attribute__((noinline)) static void* allocate_in_ctor(void) { return memset(malloc(1111), 1, 1111); }

__attribute__((constructor)) static void launched_lib_init(void) { lib_ctor_block = allocate_in_ctor(); }
