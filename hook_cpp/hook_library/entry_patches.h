// Entry patches: allocation functions no slot reaches (linked into the executable). memhook
// plans each (memhook/entry_patch/: the bytes a `jmp rel32` replaces and the relocated
// instructions), the GDB agent refuses those a stopped thread is inside, and calls
// memhook_patch_entries() with GDB's scheduler locked (no other thread runs during the call:
// code is rewritten under no thread; the call takes no lock a stopped thread could hold), which
// writes the rest here: the cells in an area near the executable (a stub jumping to the hook,
// in sampling sessions malloc's and free's sample entries inline, then the trampoline), the
// hook's real function set to the trampoline, then the jump over the function's first bytes
// (the machine code: arch/x86_64/cell_code.h). Detach puts the bytes back; the
// area is never unmapped (a thread may be inside a trampoline), and a later session reuses the
// patches an earlier one left (abandon cannot restore code while threads run).
#pragma once

#include <sys/prctl.h>

#include "cell_code.h"

#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41  // Linux 5.17: name an anonymous mapping
#define PR_SET_VMA_ANON_NAME 0
#endif

namespace {

// Kept by the library across sessions: what it patched, so that detach restores it and a later
// session neither patches it again nor points its real function at the patched entry.
struct ActiveEntry {
  uint64_t addr, target, trampoline;  // target: where its jump goes (a stub of its cell)
  uint32_t hook_id;
  uint8_t original[arch::kJumpBytes];  // what the jump replaced
};
ActiveEntry g_entries[kMaxEntries];
uint32_t g_nentries;
uint8_t* g_area;  // the trampoline area, once mapped
uint64_t g_area_bytes;
}  // namespace
// Where that area is, for the next memhook to plan its cells in (not every kernel names it in
// /proc/PID/maps): address and bytes.
extern "C" __attribute__((visibility("default"))) uint64_t memhook_entry_area[2];
uint64_t memhook_entry_area[2];
// Where the library's sample entries go on to (entry_points.h), for the cells' inline ones.
extern "C" void* memhook_filter_malloc(size_t);
extern "C" void memhook_hook_free(void*);
namespace {

bool entry_active(int hook_id) {
  for (uint32_t i = 0; i < g_nentries; i++)
    if (g_entries[i].hook_id == (uint32_t)hook_id && g_entries[i].addr) return true;
  return false;
}

ActiveEntry* active_at(uint64_t addr) {
  for (uint32_t i = 0; i < g_nentries; i++)
    if (g_entries[i].addr == addr) return &g_entries[i];
  return nullptr;
}

// The pages of [addr, addr + n) made writable, `bytes` copied in, their protection put back
// (executable code: read and execute). False, nothing written, if mprotect refuses (a W^X
// policy): the function then stays as it was.
bool write_code(uint64_t addr, const uint8_t* bytes, size_t n) {
  const uintptr_t page = page_bytes();
  const uintptr_t lo = addr & ~(page - 1), hi = (addr + n + page - 1) & ~(page - 1);
  if (mprotect((void*)lo, hi - lo, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return false;
  memcpy((void*)addr, bytes, n);
  __builtin___clear_cache((char*)addr, (char*)addr + n);  // (a no-op where caches are coherent)
  mprotect((void*)lo, hi - lo, PROT_READ | PROT_EXEC);
  return true;
}

// The area at the address memhook chose, never over a mapping (MAP_FIXED_NOREPLACE's value, for
// headers that predate it); named in /proc/PID/maps where the kernel can.
uint8_t* map_area(const Control* c) {
  if (g_area) return (uint64_t)g_area == c->entry_area ? g_area : nullptr;
  void* at = mmap((void*)c->entry_area, c->entry_area_bytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | 0x100000 /* MAP_FIXED_NOREPLACE */, -1, 0);
  if (at == MAP_FAILED) return nullptr;
  if ((uint64_t)at != c->entry_area) {  // a kernel before 4.17 took it as a hint
    munmap(at, c->entry_area_bytes);
    return nullptr;
  }
  prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, at, c->entry_area_bytes, "memhook trampolines");
  g_area = (uint8_t*)at;
  g_area_bytes = c->entry_area_bytes;
  memhook_entry_area[1] = g_area_bytes;
  __atomic_store_n(&memhook_entry_area[0], (uint64_t)at, __ATOMIC_RELEASE);
  return g_area;
}

// Where a patched entry jumps this session, the cell's stubs written for it. The stub jumps to
// the hook's entry (routing.h's choice); in a sampling session, malloc and free get their
// sample entry written into the cell itself (an unsampled call then costs two direct jumps and
// a subtraction, not a trip through the hook library: benchmarks/entry_patch.py), and the stub
// jumps to what that entry goes on to. glibc's build only: the countdown must sit at one %fs
// offset in every thread (initial-exec TLS; musl's dlopen gives each thread its own block).
uint64_t write_stubs(uint8_t* cell, uint32_t hook_id) {
  void* hook = g_hook_fn[hook_id];
  [[maybe_unused]] uint8_t* const trampoline = cell + kEntryStub;  // (the inline samplers')
  memset(cell, 0xcc, kEntryStub);
  uint8_t* target = cell;
#if !defined(MEMHOOK_MUSL) && MEMHOOK_INLINE_SAMPLERS
  const intptr_t left = (intptr_t)&t_state.sample_left - arch::thread_pointer();
  if (g_sample_rate && hook_id == ID_malloc && left == (int32_t)left) {
    hook = (void*)&memhook_filter_malloc;
    target = arch::sample_malloc(trampoline, (int32_t)left, cell);
  } else if (g_sample_rate && hook_id == ID_free) {
    hook = (void*)&memhook_hook_free;
    target = cell + kEntrySampler;
    arch::sample_free(target, g_sampled, cell, trampoline);
  }
#endif
  arch::jump_abs(cell, hook);
  return (uint64_t)target;
}

// memhook's plan, every other thread held. Each entry ends kEntryPatched (and its hook's real
// function is its trampoline), kEntryKept (an earlier session's patch, still in place, its
// stubs written for this session), kEntryChanged (its bytes are not those planned, or no
// area), or stays kEntryRefused.
__attribute__((noinline)) void patch_entries(Control* c) {
  const uint32_t n = min_of<uint32_t>(c->nentries, kMaxEntries);
  if (!n) return;
  uint8_t* area = map_area(c);
  if (area) mprotect(area, g_area_bytes, PROT_READ | PROT_WRITE);
  for (uint32_t i = 0; i < n; i++) {
    EntryPatch& e = c->entries[i];
    if (e.state != kEntryPlanned) continue;
    if (ActiveEntry* kept = active_at(e.addr)) {
      // Its stubs and jump written for this session (every thread is held; none is in the
      // area: the GDB agent refused the patches otherwise).
      g_real[kept->hook_id] = (void*)kept->trampoline;
      e.state = kEntryKept;
      if (area) {
        const uint64_t target = write_stubs((uint8_t*)kept->trampoline - kEntryStub,
                                            kept->hook_id);
        uint8_t jump[arch::kJumpBytes];
        arch::jump_near(jump, kept->addr, target);
        if (write_code(kept->addr, jump, sizeof jump))
          kept->target = target;
        else
          e.state = kEntryChanged;
      }
      continue;
    }
    void* hook = e.hook_id < (uint32_t)kMaxHooks ? g_hook_fn[e.hook_id] : nullptr;
    if (!area || !hook || g_nentries >= (uint32_t)kMaxEntries || e.length < arch::kJumpBytes ||
        e.length > kEntryOriginal || memcmp((void*)e.addr, e.original, e.length) != 0) {
      e.state = kEntryChanged;
      continue;
    }
    uint8_t* cell = (uint8_t*)e.cell;
    const uint64_t target = write_stubs(cell, e.hook_id);
    memcpy(cell + kEntryStub, e.trampoline, e.trampoline_len);
    memset(cell + kEntryStub + e.trampoline_len, 0xcc,
           kEntryCell - kEntryStub - e.trampoline_len);
    uint8_t jump[arch::kJumpBytes];
    arch::jump_near(jump, e.addr, target);
    ActiveEntry& a = g_entries[g_nentries];
    a = ActiveEntry{e.addr, target, e.cell + kEntryStub, e.hook_id, {}};
    memcpy(a.original, e.original, sizeof a.original);
    g_real[e.hook_id] = (void*)a.trampoline;  // before the jump: no call may reach the hook first
    if (!write_code(e.addr, jump, sizeof jump)) {
      g_real[e.hook_id] = (void*)e.addr;
      e.state = kEntryChanged;
      continue;
    }
    g_nentries++;
    e.state = kEntryPatched;
  }
  if (area) {
    __builtin___clear_cache((char*)area, (char*)area + g_area_bytes);
    mprotect(area, g_area_bytes, PROT_READ | PROT_EXEC);
  }
}

// Detach, every other thread held: each entry still holding its jump gets its first bytes
// back. Its hook's real function stays the trampoline, which goes on to the original code: a
// thread still inside the hook or the trampoline finishes normally.
uint32_t restore_entries() {
  uint32_t restored = 0;
  for (uint32_t i = 0; i < g_nentries; i++) {
    ActiveEntry& a = g_entries[i];
    if (!a.addr) continue;
    const uint8_t* at = (const uint8_t*)a.addr;
    if (arch::jumps_to(at, a.target) &&
        write_code(a.addr, a.original, sizeof a.original)) {
      a.addr = 0;
      restored++;
    }
  }
  uint32_t live = 0;
  for (uint32_t i = 0; i < g_nentries; i++)
    if (g_entries[i].addr) g_entries[live++] = g_entries[i];
  g_nentries = live;
  return restored;
}

}  // namespace

// Called by the GDB agent with every other thread held (scheduler-locking): see the top.
extern "C" __attribute__((visibility("default"))) int memhook_patch_entries() {
  if (!active()) return -1;
  patch_entries(g_ctl);
  return 0;
}
extern "C" __attribute__((visibility("default"))) int memhook_restore_entries() {
  return (int)restore_entries();
}
