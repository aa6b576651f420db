// Unwind rows for AArch64 PLT stubs (unwind/cfi_rows.cpp calls it). A stub (adrp x16; ldr x17;
// add x16; br x17) moves neither sp nor x29, and the return address stays in x30, where no row
// can say it is: a PC in a stub is only ever an interrupted one (a signal's), never a caller's,
// and the walk stops there as it does for any PC without rows.
#pragma once
#include <stdint.h>

#include "unwind_rows.h"

namespace memhook {
namespace arch {

template <class Emit>
void plt_rows(uint64_t addr, uint64_t size, const uint8_t* bytes, bool lazy, Emit emit) {
  emit(addr, addr + size, rule(kRowStop));
}

}  // namespace arch
}  // namespace memhook
