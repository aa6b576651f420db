// What differs between the libcs the hook library loads into, in one place. The same source is
// built twice (CMakeLists.txt): against the build host's glibc, each versioned function pinned to
// its oldest version so that every glibc from 2.17 on loads it (glibc_baseline.h); and against
// musl's headers (MEMHOOK_MUSL), for musl 1.2 and newer, linking nothing but musl's libc.
#pragma once

#include <stdint.h>

#ifdef MEMHOOK_MUSL
#include <sys/auxv.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (asm-generic/mman-common.h); newer than musl 1.2.3
#endif

namespace memhook {
// Above every frame of the main thread: the program's name, which the kernel puts at the top of
// its stack, above argv and envp (musl has no __libc_stack_end).
inline uintptr_t main_stack_top() { return (uintptr_t)getauxval(AT_EXECFN); }
}  // namespace memhook
#else
#include "glibc_baseline.h"

extern "C" void* __libc_stack_end;  // top of the main thread's stack (exported by ld.so)

namespace memhook {
// Every frame of the main thread lies below __libc_stack_end (argv/envp are above it).
inline uintptr_t main_stack_top() { return (uintptr_t)__libc_stack_end; }
}  // namespace memhook
#endif

namespace memhook {
// std::min without <algorithm>: the musl build sees C headers only (no libstdc++ of its own).
// (By reference, as std::min: the same machine code as before, benchmarks/machine_code.py.)
template <class T>
constexpr const T& min_of(const T& a, const T& b) {
  if (b < a) return b;
  return a;
}
}  // namespace memhook
