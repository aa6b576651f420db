// Libraries dlopen'ed after attach: the target patches their slots itself, from their dynamic
// sections, and notes each slot in the segment so that memhook (or abandon) restores it.
#pragma once

namespace {

struct Known {
  uintptr_t base, lo, hi;  // load bias and mapped address range
};
Known g_known[kMaxKnownObjects];
uint32_t g_nknown;
int g_scan_lock;  // only the dlopen/dlclose hooks take it, never an allocation hook

bool known(uintptr_t base) {
  for (uint32_t i = 0; i < g_nknown; i++)
    if (g_known[i].base == base) return true;
  return false;
}

int hook_id_of(const char* name) {
  for (int id = 1; id < kMaxHooks; id++)
    if (kSymbol[id] && g_hook_fn[id] && strcmp(kSymbol[id], name) == 0) return id;
  return 0;
}

void note_late_slot(uint64_t addr, uint64_t original, uint64_t hook, int id, bool readonly) {
  uint32_t i = __atomic_load_n(&g_ctl->nlate, __ATOMIC_RELAXED);
  if (i >= (uint32_t)kMaxLateSlots) return;
  PatchedSlot& s = g_ctl->late[i];
  s.addr = addr;
  s.original = original;
  s.hook = hook;
  s.hook_id = (uint32_t)id;
  s.readonly = readonly;
  __atomic_store_n(&s.state, (uint16_t)kSlotPatched, __ATOMIC_RELEASE);
  __atomic_store_n(&g_ctl->nlate, i + 1, __ATOMIC_RELEASE);
}

// What the dynamic linker would bind `symbol` to for this object. These calls go through the
// hook library's own (never patched) slots.
void* resolve_in_scope(const char* object, const char* symbol) {
  void* h = dlopen(object && object[0] ? object : nullptr, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return nullptr;
  void* f = dlsym(h, symbol);
  dlclose(h);
  return f;
}

// Patch one object's slots from its dynamic section, the same relocations memhook resolves
// with pyelftools at attach: JUMP_SLOT, GLOB_DAT and R_X86_64_64 against a hooked symbol.
void patch_object(const struct dl_phdr_info* info, uintptr_t lo, uintptr_t hi) {
  const uintptr_t base = info->dlpi_addr;
  const ElfW(Dyn)* dyn = nullptr;
  uintptr_t relro_lo = 0, relro_hi = 0;
  const uintptr_t page_mask = ~(page_bytes() - 1);
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn)*)(base + ph.p_vaddr);
    if (ph.p_type == PT_GNU_RELRO) {  // (as the loader protects it: whole pages)
      relro_lo = (base + ph.p_vaddr) & page_mask;
      relro_hi = (base + ph.p_vaddr + ph.p_memsz) & page_mask;
    }
  }
  if (!dyn) return;
  // ld.so relocates these in place for most objects; an unrelocated one is an offset.
  auto addr = [&](uintptr_t v) { return v < base ? v + base : v; };
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Rela)*rela = nullptr, *jmprel = nullptr;
  size_t relasz = 0, pltrelsz = 0;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; d++) {
    switch (d->d_tag) {
      case DT_SYMTAB: symtab = (const ElfW(Sym)*)addr(d->d_un.d_ptr); break;
      case DT_STRTAB: strtab = (const char*)addr(d->d_un.d_ptr); break;
      case DT_RELA: rela = (const ElfW(Rela)*)addr(d->d_un.d_ptr); break;
      case DT_RELASZ: relasz = d->d_un.d_val; break;
      case DT_JMPREL: jmprel = (const ElfW(Rela)*)addr(d->d_un.d_ptr); break;
      case DT_PLTRELSZ: pltrelsz = d->d_un.d_val; break;
    }
  }
  if (!symtab || !strtab) return;
  const ElfW(Rela)* tables[2] = {rela, jmprel};
  const size_t counts[2] = {relasz / sizeof(ElfW(Rela)), pltrelsz / sizeof(ElfW(Rela))};
  for (int k = 0; k < 2; k++) {
    for (size_t i = 0; tables[k] && i < counts[k]; i++) {
      const ElfW(Rela)& r = tables[k][i];
      uint32_t type = ELF64_R_TYPE(r.r_info);
      if (!arch::slot_relocation(arch::kSlotRelocations, type, r.r_addend)) continue;
      const ElfW(Sym)& s = symtab[ELF64_R_SYM(r.r_info)];
      int id = hook_id_of(strtab + s.st_name);
      if (!id) continue;
      uint64_t* slot = (uint64_t*)(base + r.r_offset);
      uint64_t cur = __atomic_load_n(slot, __ATOMIC_RELAXED);
      uint64_t hook = (uint64_t)g_hook_fn[id];
      if (cur == hook) continue;
      if (!g_real[id]) {
        // First sight of this function (say libstdc++ arrived with the library): a bound slot
        // holds the real address; a lazy one is resolved in the object's own lookup scope.
        void* found = (cur >= lo && cur < hi) ? resolve_in_scope(info->dlpi_name, kSymbol[id])
                                              : (void*)cur;
        void* expected = nullptr;
        if (found)
          __atomic_compare_exchange_n(&g_real[id], &expected, found, false, __ATOMIC_RELEASE,
                                      __ATOMIC_RELAXED);
      }
      // Only a slot still holding the real function or a lazy PLT target in this object.
      if (!g_real[id] || !holds_original(cur, (uint64_t)g_real[id], lo, hi)) continue;
      uintptr_t page = (uintptr_t)slot & page_mask;
      bool ro = page >= relro_lo && page < relro_hi;
      if (!write_slot(slot, hook, ro)) continue;
      note_late_slot((uint64_t)slot, cur, hook, id, ro);
    }
  }
}

int scan_object(struct dl_phdr_info* info, size_t, void*) {
  if (known(info->dlpi_addr) || g_nknown >= (uint32_t)kMaxKnownObjects) return 0;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    if (info->dlpi_addr + ph.p_vaddr < lo) lo = info->dlpi_addr + ph.p_vaddr;
    if (info->dlpi_addr + ph.p_vaddr + ph.p_memsz > hi) hi = info->dlpi_addr + ph.p_vaddr + ph.p_memsz;
  }
  g_known[g_nknown++] = Known{info->dlpi_addr, lo, hi};
  patch_object(info, lo, hi);
  return 0;
}

struct Probe {
  uintptr_t base;
  bool found;
};
int still_loaded(struct dl_phdr_info* info, size_t, void* data) {
  Probe* p = (Probe*)data;
  if (info->dlpi_addr == p->base) p->found = true;
  return 0;
}

void lock_scan() {
  while (__atomic_exchange_n(&g_scan_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
}
void unlock_scan() { __atomic_store_n(&g_scan_lock, 0, __ATOMIC_RELEASE); }

void rescan_loaded() {
  lock_scan();
  dl_iterate_phdr(scan_object, nullptr);
  unlock_scan();
}

// After dlclose: forget objects that are gone, so their addresses are never written again.
void forget_unloaded() {
  lock_scan();
  for (uint32_t i = 0; i < g_nknown;) {
    Probe probe{g_known[i].base, false};
    dl_iterate_phdr(still_loaded, &probe);
    if (probe.found) {
      i++;
      continue;
    }
    uint32_t n = __atomic_load_n(&g_ctl->nlate, __ATOMIC_ACQUIRE);
    for (uint32_t s = 0; s < n; s++) {
      PatchedSlot& ls = g_ctl->late[s];
      if (ls.addr >= g_known[i].lo && ls.addr < g_known[i].hi)
        __atomic_store_n(&ls.state, (uint16_t)kSlotGone, __ATOMIC_RELEASE);
    }
    g_known[i] = g_known[--g_nknown];
  }
  unlock_scan();
}

}  // namespace
