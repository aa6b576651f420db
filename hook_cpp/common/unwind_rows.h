// Unwind rows: what memhook reduces each object's DWARF call-frame information to, so that the
// hooks can walk code built without frame pointers (hook_library/unwinder.h). Built by memhook from
// .eh_frame / .debug_frame (unwind/cfi_rows.cpp), cached on disk by build-id, and carried into
// the target in the shared segment (UnwindArea below).
//
// A row holds for every PC from its start to the next row's start:
//   where the CFA is: rsp + N or rbp + N (the return address is at CFA - 8, always);
//   where the caller's rbp is: unchanged, saved at CFA - 8k, or not recoverable;
// or says that the PC is in the signal trampoline (registers come from the ucontext at rsp),
// that the stack ends here (the return address is undefined: _start, a thread's start), or that
// what CFI says here cannot be put this way (the walk stops, and says so).
#pragma once
#include <stdint.h>

namespace memhook {

enum RowKind : uint32_t {
  kRowStop = 0,    // CFI says what no row can: the walk stops here, and says so
  kRowRsp = 1,     // CFA = rsp + offset
  kRowRbp = 2,     // CFA = rbp + offset
  kRowSignal = 3,  // __restore_rt: the interrupted registers are in the ucontext at rsp
  kRowEnd = 4,     // the outermost frame: nothing called it
  kRowNone = 5,    // no CFI covers this PC (between FDEs, or past the last): code without rows
};
enum RbpRule : uint32_t { kRbpSame = 0, kRbpSaved = 1, kRbpLost = 2 };

// A rule in 32 bits: kind (3) | rbp rule (2) | rbp's slot k, at CFA - 8k (10) | last (1) | CFA
// offset / 8 (16). Offsets that are not multiples of 8, or larger, make a kRowStop. `last`
// marks an executable's main: the walk ends there, as gdb's backtrace does (what called main
// is libc's start-up, the same in every stack); its rule still gives main's CFA.
constexpr int kRbpRuleShift = 3, kRbpSlotShift = 5, kLastShift = 15, kCfaShift = 16;
constexpr uint32_t kMaxRbpSlot = (1u << 10) - 1;
constexpr uint32_t kRowLast = 1u << kLastShift;
constexpr uint32_t kMaxCfaWords = (1u << 16) - 1;
constexpr uint32_t rule(RowKind kind, uint32_t cfa_words = 0, RbpRule rbp = kRbpSame,
                        uint32_t rbp_slot = 0) {
  return uint32_t(kind) | uint32_t(rbp) << kRbpRuleShift | rbp_slot << kRbpSlotShift |
         cfa_words << kCfaShift;
}
constexpr RowKind row_kind(uint32_t r) { return RowKind(r & 7); }
constexpr RbpRule rbp_rule(uint32_t r) { return RbpRule(r >> kRbpRuleShift & 3); }
constexpr uint32_t rbp_slot(uint32_t r) { return r >> kRbpSlotShift & kMaxRbpSlot; }
constexpr bool row_last(uint32_t r) { return r & kRowLast; }
constexpr uint64_t cfa_offset(uint32_t r) { return uint64_t(r >> kCfaShift) * 8; }

// One row: its first PC (the object's link-time address, below 4 GiB) and its rule; an
// object's rows are sorted by start and cover its code up to its last row, a kRowNone.
struct Row {
  uint32_t start;
  uint32_t rule;
};

// In the segment (Control::unwind_offset, unwind_bytes): a header, then rows and indexes,
// each written once by memhook and never changed. memhook adds objects by writing their rows,
// then a complete new index of every object sorted by `lo`, then publishing that index in one
// 8-byte store (`published`); the hooks read the published index only.
struct UnwindObject {
  uint64_t lo, hi;  // the PCs its rows cover, in the target
  uint64_t bias;    // load bias: a row's start + bias is a PC in the target
  uint32_t first;   // its rows: the area's 8-byte units [first, first + nrows)
  uint32_t nrows;
};
struct UnwindArea {
  uint64_t published;  // index offset (bytes from the area's start) << 32 | number of objects
  uint64_t used;       // bytes written so far (memhook's bump pointer)
  uint64_t capacity;   // the area's bytes
  uint64_t pad[5];
};
constexpr uint64_t kMaxUnwindBytes = uint64_t(1) << 30;
constexpr uint64_t unwind_index_word(uint64_t offset, uint32_t nobjects) {
  return offset << 32 | nobjects;
}

}  // namespace memhook
