// The library memhook injects into the target. GOT slots of allocation functions are pointed at
// its entry points; each calls the real function, then appends a record to this thread's ring in
// the shared segment.
//
// Rules for everything reachable from a hook: never block, never allocate through a hooked
// path, never take a lock the target could hold, drop (and count) instead of waiting.
// TLS is initial-exec: a dlopen'ed library's dynamic TLS would be allocated with malloc on first
// touch, from inside the hook (musl, which refuses initial-exec there, allocates every thread's at
// dlopen: thread_state.h).
//
// One translation unit, one job per header, in the order a malloc meets them (dependencies
// first): the hot path's pieces inline into one another and the compiler sees every caller of
// the slow paths, as it would in one file.
#include "libc.h"  // first: every glibc from 2.17 on, or musl, loads this library

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// musl's headers name mmap64 a macro for mmap; hooks.def names both, as the symbols they are.
#undef mmap64

#include "arch.h"
#include "hook_frame.h"
#include "routing.h"
#include "segment.h"
#include "unwind_rows.h"

using namespace memhook;

#include "real_functions.h"   // hooks.def: ids, real functions, names
#include "session.h"          // the session's settings and its mode
#include "thread_state.h"     // per-thread ring, cursors, stack bounds, recursion guard
#include "recent_stacks.h"    // stacks seen before, compared instead of walked
#include "full_ring.h"        // --lossless: a full ring waits for room, a bounded time
#include "ring_writer.h"      // reserve, write, publish; drop when full
#include "address_table.h"    // each pointer's latest event: the ordering dependencies
#include "sampler.h"          // size filter and sampling: which calls are recorded
#include "unwinder.h"         // one frame at a time, by the rows memhook built
#include "python_frames.h"    // a Python thread's frames (code_records.h: their names)
#include "frame_walk.h"       // the backtrace, kept for the next allocation from there
#include "records.h"          // the records' words
#include "slots.h"            // which slots hold their original; patch, restore
#include "late_patching.h"    // libraries loaded after attach
#include "entry_patches.h"    // functions no slot reaches: their first bytes, a trampoline
#include "following.h"       // --follow-fork: a forked child, an exec, wait for memhook
#include "exit_check.h"      // exit(): wait for memhook's leak check
#include "entry_points.h"     // memhook_hook_*, memhook_sample_*, memhook_filter_*
                              // (memhook_hook_malloc: arch/<arch>/malloc_entry.S)
#include "python_allocator.h" // CPython's allocator structs: pymalloc's calls, to the hooks
#include "lifecycle.h"        // memhook_start, abandon
#include "allocator_stats.h"  // jemalloc's, tcmalloc's, mimalloc's own statistics
