/* A library loaded with dlopen whose __thread variable holds the only pointer to a block: each
 * thread's copy lives in dynamic TLS, a block the loader allocates on the thread's first touch
 * (tests/targets/dynamic_tls.c). */
#include <stdlib.h>
#include <string.h>

static __thread void* held;

__attribute__((noinline)) void hold_in_tls(void) { held = memset(malloc(1014), 0, 1014); }
