// The unwinder: one frame at a time by the rows memhook built from the target's CFI
// (common/unwind_rows.h), so that code built without frame pointers (most of every
// distribution, glibc's own strdup included) yields its whole stack. Code with no rows (JIT
// code, anonymous executable memory) gets one guarded frame-pointer step.
//
// Never harm the target: every word read is 8-aligned and lies between the walk's stack
// pointer and the top of the stack it runs on (or, past a signal frame, of the interrupted
// stack), and the CFA strictly increases, so a wrong or stale row yields a wrong frame or a cut
// stack, never a fault or a loop.
#pragma once

namespace {

const UnwindArea* g_unwind;  // the segment's unwind area (memhook_start), or null
uint64_t g_unwind_bytes;     // its size as memhook_start saw it: every index read is checked

// The rule for `pc` in the published index `word`, by binary search over objects, then rows:
// *known false when no object's rows cover it.
inline uint32_t row_search(const UnwindArea* a, uint64_t word, uint64_t pc, bool* known) {
  *known = false;
  const uint64_t at = word >> 32;
  uint32_t n = uint32_t(word);
  if (!n || at % 8 || at > g_unwind_bytes || n > (g_unwind_bytes - at) / sizeof(UnwindObject))
    return rule(kRowStop);
  const UnwindObject* objects = (const UnwindObject*)((const uint8_t*)a + at);
  uint32_t lo = 0;  // the last object whose lo <= pc
  while (n > 1) {
    const uint32_t half = n / 2;
    if (objects[lo + half].lo <= pc) lo += half;
    n -= half;
  }
  const UnwindObject& o = objects[lo];
  if (pc < o.lo || pc >= o.hi || pc - o.bias > UINT32_MAX || !o.nrows ||
      uint64_t(o.first) + o.nrows > g_unwind_bytes / sizeof(Row))
    return rule(kRowStop);
  const Row* rows = (const Row*)a + o.first;
  const uint32_t x = uint32_t(pc - o.bias);
  uint32_t r = 0, m = o.nrows;  // the last row whose start <= x
  while (m > 1) {
    const uint32_t half = m / 2;
    if (rows[r + half].start <= x) r += half;
    m -= half;
  }
  if (rows[r].start > x || row_kind(rows[r].rule) == kRowNone) return rule(kRowStop);
  *known = true;
  return rows[r].rule;
}

// The rules of PCs looked up lately, shared by the target's threads: a walk of a stack seen
// before (in another recent stack's place) costs a load per frame, not two binary searches
// over cache-cold rows. An entry is two stores, so a reader may see half of a newer one: `tag`
// holds a hash of the PC and of the index it was found in, which a torn or stale entry (an
// index published since: a library loaded or gone) fails to match. A wrong rule would cost a
// wrong frame only (the walk checks every read), and the tag makes even that unlikely.
struct RuleCacheEntry {
  uint64_t pc;
  uint64_t tag;  // the rule (bits 0-31) | known (32) | hash (33-63)
};
constexpr int kRuleCacheBits = 12;
RuleCacheEntry g_rule_cache[1 << kRuleCacheBits];

inline uint32_t row_for(uint64_t pc, bool* known) {
  const UnwindArea* a = g_unwind;
  if (!a) return *known = false, rule(kRowStop);
  const uint64_t word = __atomic_load_n(&a->published, __ATOMIC_ACQUIRE);
  const uint64_t h = (pc ^ word) * 0x9E3779B97F4A7C15ull;
  RuleCacheEntry& e = g_rule_cache[h >> (64 - kRuleCacheBits)];
  const uint64_t hash = h << 33;  // its low 31 bits (the index took the high ones)
  const uint64_t tag = __atomic_load_n(&e.tag, __ATOMIC_ACQUIRE);
  if (__atomic_load_n(&e.pc, __ATOMIC_RELAXED) == pc && (tag & ~0x1ffffffffull) == hash) {
    *known = tag >> 32 & 1;
    return uint32_t(tag);
  }
  const uint32_t r = row_search(a, word, pc, known);
  __atomic_store_n(&e.pc, pc, __ATOMIC_RELAXED);
  __atomic_store_n(&e.tag, hash | uint64_t(*known) << 32 | r, __ATOMIC_RELEASE);
  return r;
}

// The region a walk may read: [lo, hi), 8-aligned words only.
struct StackRegion {
  uint64_t lo, hi;
  bool holds(uint64_t addr) const { return addr >= lo && addr <= hi - 8 && !(addr & 7); }
};

// What a walk produced besides its frames: every word it read (for the recent stack), how
// many leading frames had the frame-pointer shape (a pair at the frame: saved rbp, return
// address), and whether its result may be kept (rows alone decided it).
struct WalkWords {
  RecentStack::Word* words;
  uint32_t n, cap;
  uint32_t pairs;
  bool leading;
  bool keep;
  int32_t unused_bp = -1;  // the word rbp was last read from, while no frame has used it
  bool bp_is_entry = true;  // rbp is still the caller's, as the hook found it
  bool entry_bp_used = false;
  uint64_t read(uint64_t addr) {
    const uint64_t v = *(const uint64_t*)addr;
    if (n < cap) words[n] = {addr, v};
    n++;
    return v;
  }
  // A saved rbp read: the previous one, if nothing used it, decided nothing.
  uint64_t read_bp(uint64_t addr) {
    forget_unused_bp();
    bp_is_entry = false;
    unused_bp = int32_t(n);
    return read(addr);
  }
  void use_bp() {
    unused_bp = -1;
    entry_bp_used |= bp_is_entry;
  }
  // An rbp that no frame used (overwritten, lost, or the walk's last) need not match in a
  // repeat: its word is marked (bit 0 of its 8-aligned address) for backtrace() to drop.
  void forget_unused_bp() {
    if (unused_bp >= 0 && uint32_t(unused_bp) < cap) words[unused_bp].addr |= kUnused;
    unused_bp = -1;
  }
  static constexpr uint64_t kUnused = 1;
};

// ucontext_t's registers: arch.h.
constexpr uint64_t kUcRbp = arch::kUcFramePointer, kUcRsp = arch::kUcStackPointer,
                   kUcRip = arch::kUcProgramCounter;

// Walks from a call site: `ret0` its return address, `sp` the stack pointer once it returned,
// `bp` rbp at the call. Writes frames (ret0 first) to [o, end); returns the end of what it
// wrote. *cfa1: the allocating function's CFA, or 0. `thread`: the thread's stack, which a
// signal frame on an alternate stack leads back to.
inline uint64_t* unwind(uint64_t ret0, uint64_t sp, uint64_t bp, StackRegion region,
                        StackRegion thread, uint64_t* o, uint64_t* const end, uint64_t* cfa1,
                        WalkWords& w) {
  *o++ = ret0;
  *cfa1 = 0;
  uint64_t pc = ret0;
  bool exact = false;   // pc is an interrupted instruction, not a return address
  bool bp_known = true;
  uint64_t lr = 0;      // the interrupted link register, while pc is exact (arch.h: AArch64's)
  while (o < end) {
    bool known;
    const uint32_t r = row_for(exact ? pc : pc - 1, &known);
    uint64_t cfa, bp_at = 0;
    bool pair = false;  // a frame record at rbp: rbp saved there, the return address above
    if (!known) {
      // No rows: one frame-pointer step, as the code may keep frame pointers. Its result is not
      // kept where rows may still come (a library loaded later).
      if (g_unwind) w.keep = false;
      if (!bp_known) return *o++ = kFrameNoUnwindInfo, o;
      w.use_bp();
      cfa = bp + 16;
      bp_at = bp;
      pair = true;
    } else {
      switch (row_kind(r)) {
        case kRowEnd:
          return o;
        case kRowRsp:
          cfa = sp + cfa_offset(r);
          break;
        case kRowRbp:
          if (!bp_known) return row_last(r) ? o : (*o++ = kFrameUnwindStopped, o);
          w.use_bp();
          cfa = bp + cfa_offset(r);
          pair = arch::frame_record_row(r);
          break;
        case kRowSignal: {
          // __restore_rt: the handler's CFA is the ucontext the kernel saved the interrupted
          // registers in. The walk goes on from them, on the interrupted stack, which is this
          // one (above) or, when the handler ran on an alternate stack, the thread's.
          w.keep = false;
          w.leading = false;
          const uint64_t uc = sp + arch::kSignalUcontext;
          if (!region.holds(uc + kUcRip)) return *o++ = kFrameUnwindStopped, o;
          const uint64_t rbp = w.read(uc + kUcRbp), rsp = w.read(uc + kUcRsp);
          const uint64_t rip = w.read(uc + kUcRip);
          if constexpr (arch::kUcLinkRegister != 0) lr = w.read(uc + arch::kUcLinkRegister);
          if (rsp > uc && rsp < region.hi && !(rsp & 7)) {
            region.lo = rsp;
          } else if (region.hi != thread.hi && rsp >= thread.lo && rsp < thread.hi && !(rsp & 7)) {
            region = {rsp, thread.hi};
          } else {
            return *o++ = kFrameUnwindStopped, o;
          }
          sp = rsp;
          bp = rbp;
          w.bp_is_entry = false;
          bp_known = true;
          pc = rip;
          exact = true;
          *o++ = rip;
          continue;
        }
        default:
          return *o++ = kFrameNoUnwindInfo, o;
      }
      if (rbp_rule(r) == kRbpSaved) bp_at = cfa - 8 * uint64_t(rbp_slot(r));
      if (row_last(r)) {  // main: its CFA for the allocating function's depth, nothing read
        if (!*cfa1 && cfa > sp && region.holds(cfa - 8)) *cfa1 = cfa;
        return o;
      }
    }
    // A return address still in the link register (arch.h: ra_slot 0): only an interrupted
    // function's, which the signal's ucontext holds; its frame may be empty (CFA = sp).
    const bool ra_in_lr = known && arch::ra_slot(r) == 0;
    if (ra_in_lr && !exact) return *o++ = kFrameUnwindStopped, o;
    // The CFA strictly increases, and what the frame holds lies on the stack above sp.
    if ((ra_in_lr ? cfa < sp || cfa >= region.hi : cfa <= sp || !region.holds(cfa - 8)) ||
        (bp_at && (bp_at < sp || !region.holds(bp_at))))
      return *o++ = known ? kFrameUnwindStopped : kFrameNoUnwindInfo, o;
    if (bp_at) {
      bp = w.read_bp(bp_at);
    } else if (known && rbp_rule(r) == kRbpLost) {
      bp_known = false;
      w.forget_unused_bp();
      w.bp_is_entry = false;
    }
    uint64_t ret;
    if (ra_in_lr) {
      ret = arch::return_address(lr);
    } else {
      const uint64_t ra_at = cfa - 8 * uint64_t(known ? arch::ra_slot(r) : 1);
      if (ra_at < sp || !region.holds(ra_at))
        return *o++ = known ? kFrameUnwindStopped : kFrameNoUnwindInfo, o;
      ret = arch::return_address(w.read(ra_at));
    }
    if (w.leading && pair) w.pairs++;
    else w.leading = false;
    if (!*cfa1) *cfa1 = cfa;
    region.lo = sp = cfa;
    pc = ret;
    exact = false;
    if (ret < 4096) return o;  // a zero return address: the outermost frame
    *o++ = ret;
  }
  return o;
}

}  // namespace
