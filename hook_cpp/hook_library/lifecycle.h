// The session's life in the target: memhook_start (called by memhook through GDB) maps the
// segment and arms the hooks (a forked child disarms its copy: following.h); abandon() puts
// everything back when memhook's heartbeat stops.
#pragma once

namespace {

int g_abandoning;

// A copy the leak check made of the process (reachability/forked_image.h) that memhook did not
// see reaped (killed meanwhile): dead with memhook, its zombie is this process's, which nobody
// else can reap. (wait4 with __WALL and no hang: the copy's exit signal is none.)
void reap_check_copy(Control* c) {
  if (!c) return;
  const int32_t copy = __atomic_exchange_n(&c->check_copy, 0, __ATOMIC_ACQ_REL);
  if (copy > 0) syscall(SYS_wait4, copy, nullptr, __WALL | WNOHANG, nullptr);
  // (memhook killed between the clone and its note of it: the stub noted it)
  if (__atomic_load_n(&c->call_kind, __ATOMIC_ACQUIRE) != kCallClone) return;
  const int64_t made = __atomic_exchange_n(&c->call_result, 0, __ATOMIC_ACQ_REL);
  if (made > 0 && made != copy) syscall(SYS_wait4, (pid_t)made, nullptr, __WALL | WNOHANG, nullptr);
}

// memhook stopped beating: pass everything through, put every slot back, give the rings' pages
// back. Runs once, on whichever thread noticed; takes only the scan lock (dlopen hooks' own).
__attribute__((noinline)) void abandon() {
  if (__atomic_exchange_n(&g_abandoning, 1, __ATOMIC_ACQUIRE)) return;
  __atomic_store_n(&g_session.mode, kOff, __ATOMIC_RELEASE);
  Control* c = g_ctl;
  lock_scan();
  restore_slots<false>(c->slots, min_of<uint32_t>(c->nslots, kMaxSlots), c->real);
  restore_slots<false>(c->late, min_of<uint32_t>(c->nlate, kMaxLateSlots), c->real);
  unhook_python_allocators(c);
  unlock_scan();
  g_unwind = nullptr;
  // The rings and the unwind area; not the recent stacks, which a hook on another thread may be
  // comparing (consumer.h: release_rings).
  const size_t rings = rings_offset(), recent = recent_stacks_offset(g_nrings, g_ring_bytes),
               unwind = unwind_offset(g_nrings, g_ring_bytes, g_depth);
  madvise((uint8_t*)c + rings, (recent - rings) & ~size_t(4095), MADV_REMOVE);  // (whole pages)
  if (g_unwind_bytes) madvise((uint8_t*)c + unwind, g_unwind_bytes, MADV_REMOVE);
  if (g_code_bytes) madvise(g_code_area, g_code_bytes, MADV_REMOVE);
  madvise(g_table, sizeof g_table, MADV_DONTNEED);
  reap_check_copy(c);
  __atomic_store_n(&c->abandoned, 1, __ATOMIC_RELEASE);
}

// (written out, not through consumer_gone: the ring writer's slow path inlines it, and its
// machine code stays as measured)
void check_consumer() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  uint64_t now = uint64_t(ts.tv_sec) * 1000000000u + ts.tv_nsec;
  uint64_t beat = __atomic_load_n(&g_ctl->heartbeat_ns, __ATOMIC_RELAXED);
  if (beat && now > beat + g_ctl->abandon_after_ns && active()) abandon();
}

// The address range of the latest session's segment. Never unmapped: a hook that read a ring
// pointer just before detach may still write through it, and must not fault.
void* g_region;
size_t g_region_bytes;

bool previous_rings_idle() {
  for (uint32_t i = 0; i < g_nrings; i++)
    if (__atomic_load_n(&ring_at(i)->busy, __ATOMIC_ACQUIRE)) return false;
  return true;
}

// Where the new segment (mapped at `fresh`) will live. Each attach would otherwise leave the
// previous segment's range mapped (its pages long released), some 300 MB of address space per
// session, which a target under RLIMIT_AS would feel. So the new segment replaces the previous
// one in place when it fits and the previous session ended cleanly (detached, no realloc still
// inside the real call). Replacing is one mmap: the range is never unmapped, so a straggling
// write lands in the new segment (the consumer checks what it reads) rather than faulting.
void* settle_segment(void* fresh, size_t bytes, int fd, bool was_active) {
  if (g_region && !was_active && bytes <= g_region_bytes && previous_rings_idle()) {
    void* at = mmap(g_region, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (at == g_region) {
      munmap(fresh, bytes);
      return at;
    }
  }
  g_region = fresh;
  g_region_bytes = bytes;
  return fresh;
}

}  // namespace

// Map the segment and arm the hooks. Runs on one target thread with GDB holding the process;
// allocates nothing itself. Returns 0, or a negative code naming what failed.
extern "C" __attribute__((visibility("default"))) int memhook_start(const char* shm_path) {
  bool avx512 = false;
  if (!arch::cpu_supported(&avx512)) return -5;
  int fd = open(shm_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  // (the system call: glibc's fstat symbol is 2.33's; glibc_baseline.h)
  if (syscall(SYS_fstat, fd, &st) != 0 || (size_t)st.st_size < sizeof(Control)) {
    close(fd);
    return -2;
  }
  const size_t bytes = (size_t)st.st_size;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return -3;
  }
  Control* c = (Control*)m;
  if (c->magic != kMagic || c->version != kVersion || c->control_bytes != sizeof(Control) ||
      c->unwind_bytes > kMaxUnwindBytes || c->unwind_bytes % 4096 ||
      c->python_bytes > kMaxCodeAreaBytes || c->python_bytes % 4096 ||
      bytes < code_area_offset(*c) + c->python_bytes ||
      c->depth > kMaxDepth ||
      c->depth < 1 || (c->ring_bytes & (c->ring_bytes - 1)) != 0 || c->nrings > kMaxRings) {
    munmap(m, bytes);
    close(fd);
    return -4;
  }
  const bool was_active = active();
  g_session.mode = kOff;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  reap_check_copy(g_ctl);  // (the last session's, before its segment may be mapped over)
  m = settle_segment(m, bytes, fd, was_active);
  close(fd);
  c = (Control*)m;
  g_ctl = c;
  memhook_ctl = c;
  // Anonymous zero pages (the table is page-aligned, so none shares a page with .data): the
  // previous session's entries are gone.
  madvise(g_table, sizeof g_table, MADV_DONTNEED);
  c->table = (uint64_t)g_table;
  g_rings = (uint8_t*)m + rings_offset();
  g_recent_stacks = (uint8_t*)m + recent_stacks_offset(c->nrings, c->ring_bytes);
  g_recent_stride = (uint32_t)recent_stack_stride(c->depth);
  memset(g_recent_kept, 0, sizeof g_recent_kept);  // (a new segment: every entry empty)
  memset(g_rule_cache, 0, sizeof g_rule_cache);  // rules of the previous session's objects
  g_unwind_bytes = c->unwind_bytes;
  g_unwind = g_unwind_bytes ? (const UnwindArea*)((uint8_t*)m + unwind_offset(c->nrings, c->ring_bytes,
                                                                             c->depth))
                            : nullptr;
#if MEMHOOK_MALLOC_ENTRY
  const bool use_avx512 = avx512 && !c->no_avx512;
  arch::pair_steps(use_avx512, &g_compare_first, &g_compare_last);
#endif
  g_nrings = c->nrings;
  g_ring_bytes = c->ring_bytes;
  g_depth = c->depth;
  // Python frames (python_frames.h), where memhook found an interpreter and a layout for it.
  madvise(g_code_seen, sizeof g_code_seen, MADV_DONTNEED);  // the last session's records
  g_code_area = (uint8_t*)m + code_area_offset(*c);
  g_ring_python = (RingPython*)((uint8_t*)m + ring_python_offset(c->nrings, c->ring_bytes, c->depth));
  g_code_bytes = c->python_bytes;
  const bool python = c->python.this_thread_state && c->python_bytes;
  g_python = python ? &c->python : nullptr;
  g_record_frames =
      g_depth + (python ? min_of<uint32_t>(min_of<uint32_t>(c->python.depth, kPythonDepth),
                                           kMaxRecordFrames - g_depth)
                        : 0);
  g_clock = c->clock;
  g_sample_rate = c->sample_rate;
  g_size_filter = c->min_size || c->max_size != UINT64_MAX;
  g_selective = c->sample_rate || g_size_filter;
  g_min_size = c->min_size;
  g_max_size = c->max_size;
  g_max_wait_ns = min_of<uint64_t>(c->max_wait_ns, kMaxWaitNs);
  g_lossless = c->lossless != 0;
  g_outlasted_at = 0;  // (a new consumer: full_ring.h)
  for (int id = 1; id < kMaxHooks; id++)
    if (c->real[id] && !entry_active(id)) g_real[id] = (void*)c->real[id];  // (else its trampoline)
  // Libraries loaded later get the entries memhook chose at attach (routing.h).
  for (const HookEntries& e : kHookEntries)
    g_hook_fn[e.id] = e.entry[entry_for(e.kind, c->sample_rate, g_size_filter)];
  uintptr_t hi = main_stack_top();
  struct rlimit rl;
  uintptr_t limit = (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                        ? rl.rlim_cur
                        : (uintptr_t)1 << 30;
  g_main_stack_hi = hi;  // (libc.h: above every frame of the main thread)
  g_main_stack_lo = hi - limit;
  g_nknown = 0;
  for (uint32_t i = 0; i < c->nknown && i < (uint32_t)kMaxKnownObjects; i++)
    g_known[g_nknown++] = Known{c->known_bases[i], 0, 0};
  Dl_info self;
  if (dladdr((void*)&memhook_start, &self)) {
    c->lib_base = (uint64_t)self.dli_fbase;
    // Never patch ourselves: our own dlopen slot must reach the real dlopen.
    if (g_nknown < (uint32_t)kMaxKnownObjects) g_known[g_nknown++] = Known{c->lib_base, 0, 0};
  }
  static bool once;
  if (!once) {
    once = true;
    pthread_atfork(nullptr, nullptr, forked_child);
  }
  memset(g_sampled, 0, sizeof g_sampled);  // the new table has no sampled block
  g_session.generation++;
  g_abandoning = 0;
  c->started = 1;
  __atomic_store_n(&g_session.mode, g_selective ? kSelective : kEvery, __ATOMIC_RELEASE);
  return 0;
}

// After memhook_start (GDB lets the other threads run during the call: each slot is one atomic
// store, and the hooks are ready before the first): patch memhook's plan (slots.h), then the
// libraries that appeared between memhook's scan and its attach. Returns the late slots
// patched, or -1 when no session is armed.
extern "C" __attribute__((visibility("default"))) int memhook_patch() {
  if (!active()) return -1;
  patch_planned(g_ctl);  // (entries first, by memhook_patch_entries: entry_patches.h)
  hook_python_allocators(g_ctl);
  rescan_loaded();
  return (int)g_ctl->nlate;
}

// memhook_start, then memhook_patch, in one call: for a target with no entry to patch (whose
// refusal check comes between the two), one call fewer in its pause. 0, start's error, or -6
// when no session is armed; the late slots patched are in the control block.
extern "C" __attribute__((visibility("default"))) int memhook_start_and_patch(const char* shm_path) {
  const int rc = memhook_start(shm_path);
  if (rc != 0) return rc;
  return memhook_patch() < 0 ? -6 : 0;
}

// Detach (the other threads run during GDB's call, as at attach): every hook passes through,
// and every slot that still holds its hook gets its original back (slots.h). Takes no lock: a
// thread GDB stopped may hold any. Returns the slots restored.
extern "C" __attribute__((visibility("default"))) int memhook_stop() {
  __atomic_store_n(&g_session.mode, kOff, __ATOMIC_RELEASE);
  Control* c = g_ctl;
  if (!c) return 0;
  reap_check_copy(c);
  unhook_python_allocators(c);
  return (int)(restore_slots<true>(c->slots, min_of<uint32_t>(c->nslots, kMaxSlots), c->real) +
               restore_slots<true>(c->late, min_of<uint32_t>(c->nlate, kMaxLateSlots), c->real));
}
