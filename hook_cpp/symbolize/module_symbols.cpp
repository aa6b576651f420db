// module_symbols.h: function tables from ELF symbol tables, and lines and inlined calls from
// DWARF, both through elfutils.
#include "module_symbols.h"

#include <dwarf.h>
#include <fcntl.h>
#include <gelf.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <tuple>
#include <unordered_map>

namespace memhook {
namespace {

// (binding, is __GI_, length): smaller is better, as symbolize.py's _BINDING_RANK.
using Rank = std::tuple<int, bool, size_t>;

int binding_rank(unsigned bind) {
  switch (bind) {
    case STB_GLOBAL: return 0;
    case STB_WEAK: return 1;
    case STB_LOCAL: return 2;
    default: return 3;
  }
}

struct Best {
  Rank rank;
  uint64_t size;
  std::string name;
};

void read_symbols(const std::string& path, std::unordered_map<uint64_t, Best>& funcs) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  for (Elf32_Word want : {SHT_SYMTAB, SHT_DYNSYM}) {
    for (Elf_Scn* scn = nullptr; elf && (scn = elf_nextscn(elf, scn));) {
      GElf_Shdr sh;
      if (!gelf_getshdr(scn, &sh) || sh.sh_type != want || !sh.sh_entsize) continue;
      Elf_Data* d = elf_getdata(scn, nullptr);
      if (!d) continue;
      size_t n = sh.sh_size / sh.sh_entsize;
      for (size_t i = 0; i < n; i++) {
        GElf_Sym sym;
        if (!gelf_getsym(d, int(i), &sym) || !sym.st_value) continue;
        unsigned type = GELF_ST_TYPE(sym.st_info);
        if (type != STT_FUNC && type != STT_GNU_IFUNC) continue;
        const char* name = elf_strptr(elf, sh.sh_link, sym.st_name);
        if (!name || !*name) continue;
        Rank rank{binding_rank(GELF_ST_BIND(sym.st_info)), strncmp(name, "__GI_", 5) == 0,
                  strlen(name)};
        auto it = funcs.find(sym.st_value);
        if (it == funcs.end() || rank < it->second.rank)
          funcs[sym.st_value] = Best{rank, std::max<uint64_t>(sym.st_size, 1), name};
      }
    }
  }
  if (elf) elf_end(elf);
  close(fd);
}

// The name a frame is reported by: the linkage (mangled) name where there is one, following
// DW_AT_abstract_origin and DW_AT_specification, else DW_AT_name.
std::string die_name(Dwarf_Die* die) {
  Dwarf_Attribute attr;
  for (int at : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name, DW_AT_name}) {
    if (dwarf_attr_integrate(die, at, &attr)) {
      const char* s = dwarf_formstring(&attr);
      if (s) return s;
    }
  }
  return "";
}

std::string call_file(Dwarf_Die* cu, Dwarf_Die* inlined) {
  Dwarf_Attribute attr;
  Dwarf_Word index;
  Dwarf_Files* files;
  size_t nfiles;
  if (!dwarf_attr(inlined, DW_AT_call_file, &attr) || dwarf_formudata(&attr, &index) != 0 ||
      dwarf_getsrcfiles(cu, &files, &nfiles) != 0 || index >= nfiles)
    return "";
  const char* f = dwarf_filesrc(files, index, nullptr, nullptr);
  return f ? f : "";
}

// A relative path is relative to the unit's DW_AT_comp_dir; libdw joins that to the line
// table's own directory (DWARF 5's directory 0) but not to the others ("../sysdeps/nptl").
std::string under_comp_dir(Dwarf_Die* cu, std::string path) {
  if (path.empty() || path[0] == '/') return path;
  Dwarf_Attribute attr;
  const char* dir = dwarf_attr(cu, DW_AT_comp_dir, &attr) ? dwarf_formstring(&attr) : nullptr;
  if (!dir || !*dir) return path;
  std::string d = dir;
  auto bare = [](const std::string& p) { return p.compare(0, 2, "./") == 0 ? p.substr(2) : p; };
  std::string prefix = bare(d) + "/";
  if (bare(path).compare(0, prefix.size(), prefix) == 0) return path;  // joined already
  return d + "/" + path;
}

int call_line(Dwarf_Die* inlined) {
  Dwarf_Attribute attr;
  Dwarf_Word line;
  if (!dwarf_attr(inlined, DW_AT_call_line, &attr) || dwarf_formudata(&attr, &line) != 0)
    return 0;
  return int(line);
}

}  // namespace

FunctionTable function_table(const std::vector<std::string>& paths) {
  elf_version(EV_CURRENT);
  std::unordered_map<uint64_t, Best> funcs;
  for (const std::string& p : paths) read_symbols(p, funcs);
  std::vector<uint64_t> order;
  order.reserve(funcs.size());
  for (auto& kv : funcs) order.push_back(kv.first);
  std::sort(order.begin(), order.end());
  FunctionTable t;
  t.starts = order;
  t.ends.reserve(order.size());
  t.names.reserve(order.size());
  for (uint64_t a : order) {
    const Best& b = funcs[a];
    t.ends.push_back(a + b.size);
    t.names.push_back(b.name);
  }
  return t;
}

DwarfLines::DwarfLines(const std::string& path) {
  elf_version(EV_CURRENT);
  fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return;
  elf_ = elf_begin(fd_, ELF_C_READ_MMAP, nullptr);
  if (elf_) dwarf_ = dwarf_begin_elf(elf_, DWARF_C_READ, nullptr);
}

DwarfLines::~DwarfLines() {
  if (dwarf_) dwarf_end(dwarf_);
  if (elf_) elf_end(elf_);
  if (fd_ >= 0) close(fd_);
}

const DwarfLines::UnitIndex& DwarfLines::index_of(Dwarf_Die* cu) {
  std::unique_ptr<UnitIndex>& slot = units_[dwarf_dieoffset(cu)];
  if (slot) return *slot;
  slot = std::make_unique<UnitIndex>();
  UnitIndex& index = *slot;
  // Depth-first over every DIE of the unit; functions and inlined calls with code become
  // scopes, each under the nearest enclosing one.
  struct Level {
    Dwarf_Die die;
    int32_t scope;
    uint32_t depth;
  };
  std::vector<Level> stack;
  Dwarf_Die child;
  if (dwarf_child(cu, &child) == 0) stack.push_back(Level{child, -1, 0});
  while (!stack.empty()) {
    Level level = stack.back();
    stack.pop_back();
    Dwarf_Die sibling;
    if (dwarf_siblingof(&level.die, &sibling) == 0)
      stack.push_back(Level{sibling, level.scope, level.depth});
    int tag = dwarf_tag(&level.die);
    int32_t scope = level.scope;
    uint32_t depth = level.depth;
    if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine ||
        tag == DW_TAG_entry_point) {
      Dwarf_Addr base, lo, hi;
      bool any = false;
      for (ptrdiff_t off = 0; (off = dwarf_ranges(&level.die, off, &base, &lo, &hi)) > 0;) {
        if (lo >= hi) continue;
        if (!any) {
          index.scopes.push_back(Scope{dwarf_dieoffset(&level.die), level.scope,
                                       tag == DW_TAG_inlined_subroutine});
          any = true;
        }
        index.ranges.push_back(ScopeRange{lo, hi, level.depth,
                                          uint32_t(index.scopes.size() - 1)});
      }
      if (any) {
        scope = int32_t(index.scopes.size() - 1);
        depth = level.depth + 1;
      }
    }
    if (dwarf_haschildren(&level.die) && dwarf_child(&level.die, &child) == 0)
      stack.push_back(Level{child, scope, depth});
  }
  std::sort(index.ranges.begin(), index.ranges.end(),
            [](const ScopeRange& a, const ScopeRange& b) {
              return a.lo != b.lo ? a.lo < b.lo : a.depth < b.depth;
            });
  return index;
}

bool DwarfLines::unit_at(uint64_t vaddr, Dwarf_Die* cu) {
  if (dwarf_addrdie(dwarf_, vaddr, cu)) return true;
  if (!unit_ranges_read_) {
    unit_ranges_read_ = true;
    Dwarf_Off off = 0, next;
    size_t header;
    while (dwarf_nextcu(dwarf_, off, &next, &header, nullptr, nullptr, nullptr) == 0) {
      Dwarf_Die die;
      if (dwarf_offdie(dwarf_, off + header, &die)) {
        Dwarf_Addr base, lo, hi;
        for (ptrdiff_t at = 0; (at = dwarf_ranges(&die, at, &base, &lo, &hi)) > 0;)
          if (lo < hi) unit_ranges_.push_back(UnitRange{lo, hi, off + header});
      }
      off = next;
    }
    std::sort(unit_ranges_.begin(), unit_ranges_.end(),
              [](const UnitRange& a, const UnitRange& b) { return a.lo < b.lo; });
  }
  auto it = std::upper_bound(unit_ranges_.begin(), unit_ranges_.end(), vaddr,
                             [](uint64_t v, const UnitRange& r) { return v < r.lo; });
  for (auto i = it; i != unit_ranges_.begin();) {  // ranges may nest or overlap: look back
    --i;
    if (vaddr < i->hi) return dwarf_offdie(dwarf_, i->offset, cu) != nullptr;
    if (it - i > 64) break;
  }
  return false;
}

std::vector<SourceFrame> DwarfLines::locate(uint64_t vaddr) {
  std::vector<SourceFrame> out;
  Dwarf_Die cu;
  if (!dwarf_ || !unit_at(vaddr, &cu)) return out;
  // The line table's row; where it has none, the unit's own name and no line (crtstuff.c's
  // functions), as llvm-symbolizer says.
  Dwarf_Line* line = dwarf_getsrc_die(&cu, vaddr);
  const char* src = line ? dwarf_linesrc(line, nullptr, nullptr) : dwarf_diename(&cu);
  int lineno = 0;
  if (line) dwarf_lineno(line, &lineno);
  std::string file = under_comp_dir(&cu, src ? src : "");
  if (file.empty()) return out;
  // The innermost function or inlined call whose ranges hold the address: of the ranges that
  // start at or before it, the last (deepest of those starting together) that holds it. Scopes
  // nest, and top-level functions do not overlap: past one that does not hold it, none will.
  const UnitIndex& index = index_of(&cu);
  auto it = std::upper_bound(index.ranges.begin(), index.ranges.end(), vaddr,
                             [](uint64_t v, const ScopeRange& r) { return v < r.lo; });
  int32_t at = -1;
  for (auto i = it; i != index.ranges.begin();) {
    --i;
    if (vaddr < i->hi) {
      at = int32_t(i->scope);
      break;
    }
    if (i->depth == 0) break;
  }
  for (; at >= 0; at = index.scopes[size_t(at)].parent) {
    const Scope& scope = index.scopes[size_t(at)];
    Dwarf_Die die;
    if (!dwarf_offdie(dwarf_, scope.die, &die)) break;
    out.push_back(SourceFrame{die_name(&die), file, lineno});
    if (!scope.inlined) break;
    file = under_comp_dir(&cu, call_file(&cu, &die));
    lineno = call_line(&die);
  }
  if (out.empty()) out.push_back(SourceFrame{"", file, lineno});  // a line, no function DIE
  return out;
}

}  // namespace memhook
