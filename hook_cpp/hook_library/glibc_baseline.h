// The hook library loads into any glibc from 2.17 on, whatever glibc it was built against: each
// versioned function it imports is bound to its oldest version (docs/benchmarks.md, tests/unit/
// test_libc_baseline.py checks the built library). Before 2.34 dlopen, dlsym, dladdr and dlclose
// live in libdl.so.2 and the pthread functions in libpthread.so.0 (the library names both as
// needed: CMakeLists.txt); since 2.34 libc.so.6 keeps these old versions for old programs.
// fstat, versioned 2.33 (before it, a macro over __fxstat), is a system call in lifecycle.h.
#pragma once

#include "arch.h"  // MEMHOOK_GLIBC_FIRST

#define MEMHOOK_OLDEST(name) __asm__(".symver " #name "," #name "@" MEMHOOK_GLIBC_FIRST)
MEMHOOK_OLDEST(dlopen);
MEMHOOK_OLDEST(dlsym);
MEMHOOK_OLDEST(dladdr);
MEMHOOK_OLDEST(dlclose);
MEMHOOK_OLDEST(pthread_attr_getstack);
MEMHOOK_OLDEST(pthread_getattr_np);
MEMHOOK_OLDEST(pthread_create);
MEMHOOK_OLDEST(pthread_detach);
#undef MEMHOOK_OLDEST
