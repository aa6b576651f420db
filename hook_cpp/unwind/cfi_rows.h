// memhook's side of the unwinder: an object file's call-frame information reduced to unwind
// rows (common/unwind_rows.h), with elfutils' libdw evaluating the CFI.
#pragma once
#include <string>
#include <vector>

#include "unwind_rows.h"

namespace memhook {

struct CfiRows {
  std::vector<Row> rows;  // sorted by start; the last a kRowStop where the code ends
  std::string source;     // ".eh_frame", ".debug_frame", or "" (none usable)
  std::string problem;    // why there are no rows, if there are none
  uint32_t fdes = 0;      // FDEs read
  uint32_t stop_rows = 0; // rows inside FDEs that no rule could express
  uint32_t functions = 0; // functions its dynamic symbol table defines (exported)
  uint64_t main = 0;      // an executable's main, whose rows say kRowLast (0: none found)
  uint64_t main_end = 0;  // where its FDE ends
};

CfiRows cfi_rows(const std::string& path);

}  // namespace memhook
