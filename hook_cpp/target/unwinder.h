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

// The rule for `pc`: *known false when no object's rows cover it.
inline uint32_t row_for(uint64_t pc, bool* known) {
  *known = false;
  const UnwindArea* a = g_unwind;
  if (!a) return rule(kRowStop);
  const uint64_t word = __atomic_load_n(&a->published, __ATOMIC_ACQUIRE);
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
  if (rows[r].start > x) return rule(kRowStop);
  *known = true;
  return rows[r].rule;
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
  uint64_t read(uint64_t addr) {
    const uint64_t v = *(const uint64_t*)addr;
    if (n < cap) words[n] = {addr, v};
    n++;
    return v;
  }
};

// ucontext_t: the interrupted rbp, rsp and rip in uc_mcontext.gregs (REG_RBP, REG_RSP, REG_RIP).
constexpr uint64_t kUcRbp = 40 + 8 * 10, kUcRsp = 40 + 8 * 15, kUcRip = 40 + 8 * 16;

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
  while (o < end) {
    bool known;
    const uint32_t r = row_for(exact ? pc : pc - 1, &known);
    uint64_t cfa, bp_at = 0;
    bool pair = false;  // the frame-pointer shape: CFA = rbp + 16, rbp saved at CFA - 16
    if (!known) {
      // No rows: one frame-pointer step, as the code may keep frame pointers. Its result is not
      // kept where rows may still come (a library loaded later).
      if (g_unwind) w.keep = false;
      if (!bp_known) return *o++ = kFrameNoUnwindInfo, o;
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
          if (!bp_known) return *o++ = kFrameUnwindStopped, o;
          cfa = bp + cfa_offset(r);
          pair = cfa_offset(r) == 16 && rbp_rule(r) == kRbpSaved && rbp_slot(r) == 2;
          break;
        case kRowSignal: {
          // __restore_rt: the handler's CFA is the ucontext the kernel saved the interrupted
          // registers in. The walk goes on from them, on the interrupted stack, which is this
          // one (above) or, when the handler ran on an alternate stack, the thread's.
          w.keep = false;
          w.leading = false;
          const uint64_t uc = sp;
          if (!region.holds(uc + kUcRip)) return *o++ = kFrameUnwindStopped, o;
          const uint64_t rbp = w.read(uc + kUcRbp), rsp = w.read(uc + kUcRsp);
          const uint64_t rip = w.read(uc + kUcRip);
          if (rsp > uc && rsp < region.hi && !(rsp & 7)) {
            region.lo = rsp;
          } else if (region.hi != thread.hi && rsp >= thread.lo && rsp < thread.hi && !(rsp & 7)) {
            region = {rsp, thread.hi};
          } else {
            return *o++ = kFrameUnwindStopped, o;
          }
          sp = rsp;
          bp = rbp;
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
    }
    // The CFA strictly increases, and what the frame holds lies on the stack above sp.
    if (cfa <= sp || !region.holds(cfa - 8) || (bp_at && (bp_at < sp || !region.holds(bp_at))))
      return *o++ = known ? kFrameUnwindStopped : kFrameNoUnwindInfo, o;
    if (bp_at) {
      bp = w.read(bp_at);
    } else if (known && rbp_rule(r) == kRbpLost) {
      bp_known = false;
    }
    const uint64_t ret = w.read(cfa - 8);
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
