// An allocator's own statistics (jemalloc, tcmalloc, mimalloc, where one is the allocator),
// read inside the target by a short-lived thread this library starts, so that the reading
// (jemalloc's refresh merges every arena's counters) happens after GDB has let the process go,
// not in its pause. The thread blocks every signal, records none of its own allocations, writes
// the values into the segment and ends. memhook names the function and its kind (Control).
#pragma once

namespace {

// The values, per kind, in Control::stats order (memhook/consumer/allocator_stats.py names them):
//   jemalloc (mallctl): allocated, active, resident, retained, mapped, metadata
//   tcmalloc (MallocExtension_GetNumericProperty): allocated, heap size, page heap free,
//     page heap unmapped, thread caches, central cache free
//   mimalloc (mi_process_info): current rss, peak rss, current commit, peak commit
const char* const kJemallocStats[] = {"stats.allocated", "stats.active", "stats.resident",
                                      "stats.retained", "stats.mapped", "stats.metadata"};
const char* const kTcmallocStats[] = {
    "generic.current_allocated_bytes", "generic.heap_size", "tcmalloc.pageheap_free_bytes",
    "tcmalloc.pageheap_unmapped_bytes", "tcmalloc.current_total_thread_cache_bytes",
    "tcmalloc.central_cache_free_bytes"};

using mallctl_t = int (*)(const char*, void*, size_t*, void*, size_t);
using numeric_property_t = int (*)(const char*, size_t*);
using process_info_t = void (*)(size_t*, size_t*, size_t*, size_t*, size_t*, size_t*, size_t*,
                                size_t*);

void* read_allocator_stats(void* arg) {
  Control* c = (Control*)arg;
  t_state.in_hook = 1;  // its allocations (if any) are the allocator's business, not the program's
  uint64_t v[kStatsValues];
  for (uint64_t& x : v) x = kStatsNone;
  const uint64_t fn = c->stats_fn;
  switch (c->stats_kind) {
    case kStatsJemalloc: {
      auto mallctl = (mallctl_t)fn;
      // No thread cache for this thread: one would be counted in the very statistics it reads.
      bool off = false;
      mallctl("thread.tcache.enabled", nullptr, nullptr, &off, sizeof off);
      uint64_t epoch = 1;
      size_t len = sizeof epoch;
      mallctl("epoch", &epoch, &len, &epoch, len);  // refresh the merged counters
      for (int i = 0; i < 6; i++) {
        size_t value = 0;
        len = sizeof value;
        if (mallctl(kJemallocStats[i], &value, &len, nullptr, 0) == 0) v[i] = value;
      }
      break;
    }
    case kStatsTcmalloc: {
      auto get = (numeric_property_t)fn;
      for (int i = 0; i < 6; i++) {
        size_t value = 0;
        if (get(kTcmallocStats[i], &value)) v[i] = value;
      }
      break;
    }
    case kStatsMimalloc: {
      size_t elapsed, user, sys, rss, peak_rss, commit, peak_commit, faults;
      ((process_info_t)fn)(&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
      v[0] = rss, v[1] = peak_rss, v[2] = commit, v[3] = peak_commit;
      break;
    }
  }
  for (int i = 0; i < kStatsValues; i++) c->stats[i] = v[i];
  __atomic_store_n(&c->stats_state, kStatsDone, __ATOMIC_RELEASE);
  return nullptr;
}

}  // namespace

// Start the reading thread (memhook calls this through GDB, at attach and at detach); it runs
// once GDB lets the process go. 0: started; -1: nothing to read; -2: no thread could be made.
extern "C" __attribute__((visibility("default"))) int memhook_read_stats() {
  Control* c = g_ctl;
  if (!c || !c->stats_fn || !c->stats_kind) return -1;
  __atomic_store_n(&c->stats_state, kStatsRunning, __ATOMIC_RELEASE);
  Guard guard(t_state);  // the new thread's stack and TLS are not the program's allocations
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old);  // the thread starts with every signal blocked
  pthread_t thread;
  const int rc = pthread_create(&thread, nullptr, read_allocator_stats, c);
  sigprocmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    __atomic_store_n(&c->stats_state, kStatsFailed, __ATOMIC_RELEASE);
    return -2;
  }
  pthread_detach(thread);
  return 0;
}
