// A module's function names and source lines, read natively with elfutils' libelf and libdw for
// `memhook report`: what pyelftools did one symbol at a time in Python, and llvm-symbolizer or
// addr2line did in a subprocess per module (issue 43: reports at the speed of the machine).
#pragma once
#include <elfutils/libdw.h>
#include <libelf.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace memhook {

// The functions of the symbol tables (.symtab, then .dynsym) of each file in turn, sorted by
// address: STT_FUNC and STT_GNU_IFUNC symbols with a name and an address. Of the aliases at one
// address the best-ranked name is kept (global, then weak, then local; not glibc's internal
// __GI_ alias; the shortest; the first seen of equals), as memhook/symbolize.py always has.
struct FunctionTable {
  std::vector<uint64_t> starts, ends;
  std::vector<std::string> names;
};
FunctionTable function_table(const std::vector<std::string>& paths);

// One frame at an address: the function (its linkage name where DWARF has one, for the
// demangler, else its name), and the file and line.
struct SourceFrame {
  std::string function;
  std::string file;
  int line = 0;
};

// A file's DWARF, opened once; each address answers with its frames innermost first: the
// inlined calls, each at the line the next inner one was called from, then the function they
// were inlined into, as `addr2line -i` and llvm-symbolizer --inlines list them.
class DwarfLines {
 public:
  explicit DwarfLines(const std::string& path);
  ~DwarfLines();
  DwarfLines(const DwarfLines&) = delete;
  DwarfLines& operator=(const DwarfLines&) = delete;
  bool ok() const { return dwarf_ != nullptr; }
  std::vector<SourceFrame> locate(uint64_t vaddr);

 private:
  // One compile unit's functions and inlined calls with their address ranges, from one walk
  // of its DIEs (dwarf_getscopes walks them again for every address: 0.14 ms each in libc).
  struct Scope {
    Dwarf_Off die;
    int32_t parent;  // the enclosing function or inlined call, -1 for none
    bool inlined;
  };
  struct ScopeRange {
    uint64_t lo, hi;
    uint32_t depth, scope;
  };
  struct UnitIndex {
    std::vector<Scope> scopes;
    std::vector<ScopeRange> ranges;  // sorted by (lo, depth)
  };
  const UnitIndex& index_of(Dwarf_Die* cu);
  bool unit_at(uint64_t vaddr, Dwarf_Die* cu);
  std::unordered_map<Dwarf_Off, std::unique_ptr<UnitIndex>> units_;
  int fd_ = -1;
  // Units found by their own ranges, for addresses .debug_aranges leaves out (crtstuff.c's):
  // [lo, hi) and the unit's offset, sorted, built on the first such address.
  struct UnitRange { uint64_t lo, hi; Dwarf_Off offset; };
  std::vector<UnitRange> unit_ranges_;
  bool unit_ranges_read_ = false;
  Elf* elf_ = nullptr;
  Dwarf* dwarf_ = nullptr;
};

}  // namespace memhook
