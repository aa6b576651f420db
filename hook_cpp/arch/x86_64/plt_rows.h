// Unwind rows for x86-64 PLT stubs, from their code: their CFI is an expression no row can hold.
// A .plt.sec or .plt.got stub is a jump through the GOT: the CFA is rsp + 8 throughout. A .plt
// stub pushes a relocation index and jumps to PLT0, which pushes one more word: rsp + 8 before
// the push, + 16 after it, + 24 in PLT0 after its own push. (unwind/cfi_rows.cpp calls it.)
#pragma once
#include <stdint.h>
#include <string.h>

#include "unwind_rows.h"

namespace memhook {
namespace arch {

// `emit(start, end, rule)` for each span of the PLT section at `addr` (its `size` bytes of code
// at `bytes`); `lazy`: a .plt (stubs that push an index), else .plt.sec / .plt.got.
template <class Emit>
void plt_rows(uint64_t addr, uint64_t size, const uint8_t* bytes, bool lazy, Emit emit) {
  if (!lazy) {
    emit(addr, addr + size, rule(kRowRsp, 1));
    return;
  }
  static const uint8_t endbr64[] = {0xf3, 0x0f, 0x1e, 0xfa};
  for (uint64_t at = 0; at + 16 <= size; at += 16) {
    const uint8_t* b = bytes + at;
    const uint64_t pc = addr + at;
    const int skip = memcmp(b, endbr64, 4) == 0 ? 4 : 0;
    if (at == 0 && b[skip] == 0xff && b[skip + 1] == 0x35) {  // PLT0: push GOT[1]
      emit(pc, pc + skip + 6, rule(kRowRsp, 2));
      emit(pc + skip + 6, pc + 16, rule(kRowRsp, 3));
      continue;
    }
    int push = -1;  // where `push $index` is
    if (skip && b[4] == 0x68) push = 4;
    else if (b[0] == 0xff && b[1] == 0x25 && b[6] == 0x68) push = 6;
    if (push < 0) {
      emit(pc, pc + 16, rule(kRowStop));
      continue;
    }
    emit(pc, pc + push + 5, rule(kRowRsp, 1));
    emit(pc + push + 5, pc + 16, rule(kRowRsp, 2));
  }
}

}  // namespace arch
}  // namespace memhook
