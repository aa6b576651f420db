// The slots: which ones hold their original, patching them, putting them back. The one owner
// of these rules: memhook plans the slots it found at attach (Control::slots) and
// memhook_patch() patches them here, each with one atomic store; libraries loaded later are
// patched here from late_patching.h; detach (memhook_stop) and abandon restore them here.
#pragma once

namespace {

void* g_hook_fn[kMaxHooks];  // each hooked function's entry this session (routing.h)

// A slot holds its original when it holds the real function, or an address in [lazy_lo,
// lazy_hi): the object's PLT, where a lazily bound slot points until its first call. Anything
// else is someone else's (another profiler, the program's own hook): left alone.
inline bool holds_original(uint64_t cur, uint64_t real, uint64_t lazy_lo, uint64_t lazy_hi) {
  return (real && cur == real) || (cur >= lazy_lo && cur < lazy_hi);
}

// The kernel's page size (AArch64 kernels use 4, 16 or 64 KiB), the unit of mprotect and msync.
inline uintptr_t page_bytes() { return (uintptr_t)getpagesize(); }

// One 8-byte store into a slot, through mprotect when the slot's page is read-only (RELRO).
bool write_slot(uint64_t* slot, uint64_t value, bool readonly) {
  const uintptr_t bytes = page_bytes(), page = (uintptr_t)slot & ~(bytes - 1);
  if (readonly && mprotect((void*)page, bytes, PROT_READ | PROT_WRITE) != 0) return false;
  __atomic_store_n(slot, value, __ATOMIC_RELEASE);
  if (readonly) mprotect((void*)page, bytes, PROT_READ);
  return true;
}

// Is a slot's page still mapped (its object may have been unloaded since memhook's scan)?
// msync says so without touching it, and takes no lock.
__attribute__((noinline)) bool slot_mapped(uint64_t addr) {
  const uintptr_t bytes = page_bytes();
  return addr % 8 == 0 && msync((void*)(addr & ~(bytes - 1)), bytes, MS_ASYNC) == 0;
}

// memhook's plan (state kSlotPlanned: addr, original = the real function or 0, hook_id,
// readonly; its PLT in Control::lazy), each slot patched or left alone. A slot that holds this library's own
// hook was patched by an earlier session whose memhook died: it is taken over as holding the
// real function. What was found is written back: kSlotPatched with the original, or
// kSlotSkipped with the value found (kSlotUnreadable: the page is gone).
__attribute__((noinline)) void patch_planned(Control* c) {
  const uint32_t n = c->nslots < (uint32_t)kMaxSlots ? c->nslots : (uint32_t)kMaxSlots;
  for (uint32_t i = 0; i < n; i++) {
    PatchedSlot& s = c->slots[i];
    if (s.state != kSlotPlanned || s.hook_id == 0 || s.hook_id >= (uint32_t)kMaxHooks) continue;
    const uint64_t hook = (uint64_t)g_hook_fn[s.hook_id];
    if (!slot_mapped(s.addr)) {
      s.state = kSlotUnreadable;
      continue;
    }
    uint64_t cur = __atomic_load_n((const uint64_t*)s.addr, __ATOMIC_RELAXED);
    if (hook && cur == hook && s.original) cur = s.original;
    if (!hook || !holds_original(cur, s.original, c->lazy[i].lo, c->lazy[i].hi) ||
        !write_slot((uint64_t*)s.addr, hook, s.readonly)) {
      s.original = cur;
      s.state = kSlotSkipped;
      continue;
    }
    s.original = cur;
    s.hook = hook;
    __atomic_store_n(&s.state, (uint16_t)kSlotPatched, __ATOMIC_RELEASE);
  }
}

// Every slot still patched and still holding its hook gets its original back. One holding the
// real function was bound by the dynamic loader over the hook (a thread inside _dl_fixup for
// its first call as memhook patched it: the loader's store came last): nothing of memhook's is
// in it, it is left as the loader made it, and marked kSlotRebound (calls through it went
// untraced; memhook says so). One holding anything else (the program wrote it since) is left as
// it is, and stays marked patched. `probe`: first check that the slot's page is still mapped
// (detach: its object may have been unloaded since memhook's scan). `real`: Control::real.
template <bool probe>
uint32_t restore_slots(PatchedSlot* slots, uint32_t n, const uint64_t* real) {
  uint32_t restored = 0;
  for (uint32_t i = 0; i < n; i++) {
    PatchedSlot& s = slots[i];
    if (__atomic_load_n(&s.state, __ATOMIC_ACQUIRE) != kSlotPatched) continue;
    uint64_t* slot = (uint64_t*)s.addr;
    if (probe && !slot_mapped(s.addr)) continue;
    const uint64_t cur = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (cur == s.hook && write_slot(slot, s.original, s.readonly)) {
      __atomic_store_n(&s.state, (uint16_t)kSlotRestored, __ATOMIC_RELEASE);
      restored++;
    } else if (s.hook_id < (uint32_t)kMaxHooks && real[s.hook_id] &&
               cur == real[s.hook_id]) {
      __atomic_store_n(&s.state, (uint16_t)kSlotRebound, __ATOMIC_RELEASE);
      restored++;
    }
  }
  return restored;
}

}  // namespace
