// Unwind rows from an object's CFI. libdw does the DWARF (every FDE's program run up to each PC,
// CIE and FDE encodings, augmentations); this file only enumerates FDEs and recognises the few
// rule shapes a row can hold (unwind_rows.h). PLT stubs get rows written here from their
// known shape, as their CFI is an expression.
#include "cfi_rows.h"

#include "arch.h"
#include "plt_rows.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

namespace memhook {
namespace {

constexpr int kRegRbp = arch::kDwarfFramePointer, kRegRsp = arch::kDwarfStackPointer,
              kRegRa = arch::kDwarfReturnAddress;

struct Span {
  uint64_t start, end;
  uint32_t rule;
};

struct Sections {
  Elf_Data* eh_frame_hdr = nullptr;
  uint64_t eh_frame_hdr_addr = 0;
  Elf_Data* debug_frame = nullptr;
  Elf_Data* eh_frame = nullptr;
  uint64_t eh_frame_addr = 0;
  bool has_eh_frame = false;
  struct Plt {
    const uint8_t* bytes;
    uint64_t addr, size;
    bool lazy;  // .plt: stubs that push a relocation index before jumping to PLT0
  };
  std::vector<Plt> plts;
};

Sections find_sections(Elf* elf) {
  Sections s;
  size_t shstrndx;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return s;
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf, scn));) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type == SHT_NOBITS) continue;
    const char* name = elf_strptr(elf, shstrndx, sh.sh_name);
    if (!name) continue;
    if (!strcmp(name, ".eh_frame_hdr")) {
      s.eh_frame_hdr = elf_getdata(scn, nullptr);
      s.eh_frame_hdr_addr = sh.sh_addr;
    } else if (!strcmp(name, ".eh_frame")) {
      s.has_eh_frame = sh.sh_size > 0;
      s.eh_frame = elf_getdata(scn, nullptr);
      s.eh_frame_addr = sh.sh_addr;
    } else if (!strcmp(name, ".debug_frame")) {
      s.debug_frame = elf_getdata(scn, nullptr);
    } else if (!strcmp(name, ".plt") || !strcmp(name, ".plt.sec") || !strcmp(name, ".plt.got")) {
      Elf_Data* d = elf_getdata(scn, nullptr);
      if (d && d->d_size == sh.sh_size && sh.sh_size)
        s.plts.push_back({(const uint8_t*)d->d_buf, sh.sh_addr, sh.sh_size, !strcmp(name, ".plt")});
    }
  }
  return s;
}

// The size of a pointer encoded as `enc` (DW_EH_PE_*), for the fixed-size ones.
int encoded_size(uint8_t enc) {
  switch (enc & 0x0f) {
    case DW_EH_PE_udata4: case DW_EH_PE_sdata4: return 4;
    case DW_EH_PE_udata8: case DW_EH_PE_sdata8: case DW_EH_PE_absptr: return 8;
    default: return 0;
  }
}

// FDE start addresses from .eh_frame_hdr's search table: (initial location, FDE) pairs, sorted,
// as every linker writes it (datarel sdata4 from the section's start).
bool starts_from_hdr(const Sections& s, std::vector<uint64_t>* out) {
  const Elf_Data* d = s.eh_frame_hdr;
  if (!d || d->d_size < 4) return false;
  const uint8_t* h = (const uint8_t*)d->d_buf;
  const int ptr_size = encoded_size(h[1]), count_size = encoded_size(h[2]);
  if (h[0] != 1 || h[3] != (DW_EH_PE_datarel | DW_EH_PE_sdata4) || !ptr_size ||
      count_size != 4 || (h[2] & 0x70) != 0)
    return false;
  const size_t table = 4 + ptr_size + count_size;
  if (d->d_size < table) return false;
  uint32_t count;
  memcpy(&count, h + 4 + ptr_size, 4);
  if ((d->d_size - table) / 8 < count) return false;
  for (uint32_t i = 0; i < count; i++) {
    int32_t loc;
    memcpy(&loc, h + table + 8 * i, 4);
    out->push_back(s.eh_frame_hdr_addr + int64_t(loc));
  }
  return true;
}

// FDE start addresses from .debug_frame, whose initial locations are plain addresses.
void starts_from_debug_frame(Elf* elf, Elf_Data* data, std::vector<uint64_t>* out) {
  const unsigned char* ident = (const unsigned char*)elf_getident(elf, nullptr);
  Dwarf_Off off = 0, next;
  Dwarf_CFI_Entry e;
  for (int rc; off != (Dwarf_Off)-1; off = next) {
    rc = dwarf_next_cfi(ident, data, false, off, &next, &e);
    if (rc > 0) break;
    if (rc < 0) {
      if (next == off || next == (Dwarf_Off)-1) break;
      continue;
    }
    if (dwarf_cfi_cie_p(&e) || e.fde.end - e.fde.start < 8) continue;
    uint64_t loc;
    memcpy(&loc, e.fde.start, 8);
    if (loc) out->push_back(loc);
  }
}

// FDE start addresses from .eh_frame itself, for objects linked without its search table
// (musl-gcc's specs leave out --eh-frame-hdr). libdw enumerates the entries; an FDE's initial
// location is encoded as its CIE's augmentation says ('R'), which libdw does not decode here:
// absolute or PC-relative, 4 or 8 bytes (what compilers write). False if any is otherwise.
bool starts_from_eh_frame(Elf* elf, const Sections& s, std::vector<uint64_t>* out) {
  if (!s.eh_frame || !s.eh_frame->d_buf) return false;
  const unsigned char* ident = (const unsigned char*)elf_getident(elf, nullptr);
  const uint8_t* base = (const uint8_t*)s.eh_frame->d_buf;
  std::vector<std::pair<Dwarf_Off, uint8_t>> encodings;  // CIE offset -> FDE pointer encoding
  Dwarf_Off off = 0, next;
  Dwarf_CFI_Entry e;
  for (int rc; off != (Dwarf_Off)-1; off = next) {
    rc = dwarf_next_cfi(ident, s.eh_frame, true, off, &next, &e);
    if (rc > 0) break;
    if (rc < 0) return false;
    if (dwarf_cfi_cie_p(&e)) {
      uint8_t enc = DW_EH_PE_absptr;
      const char* aug = e.cie.augmentation;
      const uint8_t *a = e.cie.augmentation_data, *a_end = a + e.cie.augmentation_data_size;
      for (size_t i = aug[0] == 'z' ? 1 : strlen(aug); aug[i] && a < a_end; i++) {
        if (aug[i] == 'R') enc = *a++;
        else if (aug[i] == 'L') a++;
        else if (aug[i] == 'P') {
          const int n = encoded_size(*a);
          if (!n) return false;
          a += 1 + n;
        } else if (aug[i] != 'S' && aug[i] != 'B') {
          return false;
        }
      }
      encodings.push_back({off, enc});
      continue;
    }
    auto cie = std::find_if(encodings.begin(), encodings.end(),
                            [&](const auto& c) { return c.first == e.fde.CIE_pointer; });
    if (cie == encodings.end()) return false;
    const uint8_t enc = cie->second;
    const int n = encoded_size(enc);
    if (!n || (enc & 0x70) > DW_EH_PE_pcrel || e.fde.end - e.fde.start < n) return false;
    int64_t v = 0;
    if (n == 4 && (enc & 0x0f) == DW_EH_PE_sdata4) {
      int32_t x;
      memcpy(&x, e.fde.start, 4);
      v = x;
    } else if (n == 4) {
      uint32_t x;
      memcpy(&x, e.fde.start, 4);
      v = x;
    } else {
      memcpy(&v, e.fde.start, 8);
    }
    if ((enc & 0x70) == DW_EH_PE_pcrel) v += int64_t(s.eh_frame_addr + (e.fde.start - base));
    if (v) out->push_back(uint64_t(v));
  }
  return true;
}

// Offset k of a register saved at CFA + offset (as libdw states it: CFA, plus_uconst n), or -1.
int64_t cfa_relative(const Dwarf_Op* ops, size_t n) {
  if (n == 1 && ops[0].atom == DW_OP_call_frame_cfa) return 0;
  if (n == 2 && ops[0].atom == DW_OP_call_frame_cfa && ops[1].atom == DW_OP_plus_uconst)
    return int64_t(ops[1].number);
  return INT64_MIN;
}

// The row for one frame state, or a kRowStop.
uint32_t rule_of(Dwarf_Frame* f, bool signal) {
  if (signal) return rule(kRowSignal);
  Dwarf_Op mem[3], *ops;
  size_t n;
  if (dwarf_frame_register(f, kRegRa, mem, &ops, &n) != 0) return rule(kRowStop);
  if (n == 0 && ops == mem) return rule(kRowEnd);  // undefined: the outermost frame
  const bool ra_kept = n == 0 && !ops;  // same value: still in its register (AArch64's x30)
  const int64_t ra_at = ra_kept ? 0 : cfa_relative(ops, n);
  if (!ra_kept && (ra_at == INT64_MIN || ra_at >= 0 || ra_at % 8)) return rule(kRowStop);
  if (dwarf_frame_cfa(f, &ops, &n) != 0 || n != 1) return rule(kRowStop);
  uint64_t reg, off;
  if (ops[0].atom == DW_OP_bregx) {
    reg = ops[0].number;
    off = ops[0].number2;
  } else if (ops[0].atom >= DW_OP_breg0 && ops[0].atom <= DW_OP_breg31) {
    reg = ops[0].atom - DW_OP_breg0;
    off = ops[0].number;
  } else {
    return rule(kRowStop);
  }
  if ((reg != kRegRsp && reg != kRegRbp) || int64_t(off) < int64_t(!ra_kept) || off % 8 ||
      off / 8 > kMaxCfaWords)
    return rule(kRowStop);
  const RowKind kind = reg == kRegRsp ? kRowRsp : kRowRbp;
  RbpRule rbp = kRbpLost;
  uint32_t slot = 0;
  if (dwarf_frame_register(f, kRegRbp, mem, &ops, &n) == 0) {
    if (n == 0 && !ops) {
      rbp = kRbpSame;
    } else {
      const int64_t at = cfa_relative(ops, n);
      if (at < 0 && at > INT64_MIN && at % 8 == 0 && -at / 8 <= kMaxRbpSlot) {
        rbp = kRbpSaved;
        slot = uint32_t(-at / 8);
      }
    }
  }
  if (ra_kept ? !arch::ra_in_register(&rbp, &slot) : !arch::ra_rule(-ra_at / 8, &rbp, &slot))
    return rule(kRowStop);  // (arch.h)
  return rule(kind, uint32_t(off / 8), rbp, slot);
}

// PLT stubs by their code (the processor's: arch/x86_64/plt_rows.h).
void plt_spans(const Sections::Plt& p, std::vector<Span>* out) {
  arch::plt_rows(p.addr, p.size, p.bytes, p.lazy,
                 [out](uint64_t lo, uint64_t hi, uint32_t r) { out->push_back({lo, hi, r}); });
}

// Sorted, non-overlapping spans (later spans win where they overlap earlier ones: PLT rows
// over CFI) into rows: a kRowNone wherever no span covers, equal neighbours merged.
std::vector<Row> to_rows(std::vector<Span> cfi, std::vector<Span> plt) {
  std::sort(plt.begin(), plt.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  std::vector<Span> all;
  for (const Span& s : cfi) {
    // Cut CFI spans around PLT sections.
    uint64_t start = s.start;
    for (const Span& p : plt) {
      if (p.end <= start || p.start >= s.end) continue;
      if (p.start > start) all.push_back({start, p.start, s.rule});
      start = std::max(start, p.end);
    }
    if (start < s.end) all.push_back({start, s.end, s.rule});
  }
  all.insert(all.end(), plt.begin(), plt.end());
  std::sort(all.begin(), all.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  std::vector<Row> rows;
  uint64_t covered = 0;
  for (const Span& s : all) {
    if (s.end <= s.start || s.start < covered) continue;  // overlapping FDEs: the first wins
    if (s.end > UINT32_MAX) break;
    if (!rows.empty() && s.start > covered) rows.push_back({uint32_t(covered), rule(kRowNone)});
    if (rows.empty() || rows.back().rule != s.rule || s.start > covered)
      rows.push_back({uint32_t(s.start), s.rule});
    covered = s.end;
  }
  if (!rows.empty()) rows.push_back({uint32_t(covered), rule(kRowNone)});
  return rows;
}

// The bytes at link-time address [addr, addr + n) of a section with contents, or null.
const uint8_t* bytes_at(Elf* elf, uint64_t addr, uint64_t n) {
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf, scn));) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_PROGBITS || !(sh.sh_flags & SHF_ALLOC) ||
        addr < sh.sh_addr || addr + n > sh.sh_addr + sh.sh_size)
      continue;
    Elf_Data* d = elf_getdata(scn, nullptr);
    if (!d || d->d_size != sh.sh_size) return nullptr;
    return (const uint8_t*)d->d_buf + (addr - sh.sh_addr);
  }
  return nullptr;
}

// Where an executable's main is (0 if unknown): its symbol, or, in a stripped executable, the
// argument its entry point (glibc's _start, crt1.o) passes to __libc_start_main in %rdi:
// `lea main(%rip), %rdi` (PIE) or `mov $main, %rdi`, right before `call *...(%rip)`.
uint64_t main_address(Elf* elf, const GElf_Ehdr& eh) {
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf, scn));) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM))
      continue;
    Elf_Data* d = elf_getdata(scn, nullptr);
    const size_t n = d && sh.sh_entsize ? sh.sh_size / sh.sh_entsize : 0;
    for (size_t i = 0; i < n; i++) {
      GElf_Sym sym;
      if (!gelf_getsym(d, int(i), &sym) || GELF_ST_TYPE(sym.st_info) != STT_FUNC ||
          sym.st_shndx == SHN_UNDEF)
        continue;
      const char* name = elf_strptr(elf, sh.sh_link, sym.st_name);
      if (name && !strcmp(name, "main")) return sym.st_value;
    }
  }
  constexpr uint64_t kScan = 48;
  const uint8_t* c = eh.e_entry ? bytes_at(elf, eh.e_entry, kScan) : nullptr;
  if (!c) return 0;
  uint64_t found = 0;
  for (uint64_t i = 0; i + 13 <= kScan; i++) {
    const bool call = c[i + 7] == 0xff && c[i + 8] == 0x15;
    if (!call || c[i] != 0x48) continue;
    int32_t v;
    memcpy(&v, c + i + 3, 4);
    if (c[i + 1] == 0x8d && c[i + 2] == 0x3d) found = eh.e_entry + i + 7 + int64_t(v);
    else if (c[i + 1] == 0xc7 && c[i + 2] == 0xc7) found = uint64_t(int64_t(v));
    if (found) break;
  }
  return found;
}

// Functions the dynamic symbol table defines: what an object exports, to weigh its FDE count
// against (musl's libc.so, built without unwind tables, has a handful of FDEs for ~1500).
uint32_t exported_functions(Elf* elf) {
  uint32_t n = 0;
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(elf, scn));) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_DYNSYM) continue;
    Elf_Data* d = elf_getdata(scn, nullptr);
    const size_t count = d && sh.sh_entsize ? sh.sh_size / sh.sh_entsize : 0;
    for (size_t i = 0; i < count; i++) {
      GElf_Sym sym;
      n += gelf_getsym(d, int(i), &sym) && GELF_ST_TYPE(sym.st_info) == STT_FUNC &&
           sym.st_shndx != SHN_UNDEF;
    }
  }
  return n;
}

struct ElfFile {
  int fd = -1;
  Elf* elf = nullptr;
  Dwarf* dwarf = nullptr;
  Dwarf_CFI* eh = nullptr;
  ~ElfFile() {
    if (eh) dwarf_cfi_end(eh);
    if (dwarf) dwarf_end(dwarf);
    if (elf) elf_end(elf);
    if (fd >= 0) close(fd);
  }
};

}  // namespace

CfiRows cfi_rows(const std::string& path) {
  CfiRows out;
  elf_version(EV_CURRENT);
  ElfFile f;
  f.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    out.problem = std::string("cannot open: ") + strerror(errno);
    return out;
  }
  f.elf = elf_begin(f.fd, ELF_C_READ_MMAP, nullptr);
  GElf_Ehdr eh;
  if (!f.elf || elf_kind(f.elf) != ELF_K_ELF || !gelf_getehdr(f.elf, &eh) ||
      gelf_getclass(f.elf) != ELFCLASS64 || eh.e_machine != arch::kElfMachine) {
    out.problem = std::string("not an ") + arch::kName + " ELF file";
    return out;
  }
  const Sections s = find_sections(f.elf);
  out.functions = exported_functions(f.elf);
  std::vector<uint64_t> starts;
  Dwarf_CFI* cfi = nullptr;
  if (s.has_eh_frame && (starts_from_hdr(s, &starts) || starts_from_eh_frame(f.elf, s, &starts)) &&
      (f.eh = dwarf_getcfi_elf(f.elf))) {
    cfi = f.eh;
    out.source = s.eh_frame_hdr ? ".eh_frame" : ".eh_frame (no search table)";
  } else if (s.debug_frame && (f.dwarf = dwarf_begin_elf(f.elf, DWARF_C_READ, nullptr)) &&
             (cfi = dwarf_getcfi(f.dwarf))) {
    starts.clear();
    starts_from_debug_frame(f.elf, s.debug_frame, &starts);
    out.source = ".debug_frame";
  } else {
    starts.clear();
    out.problem = s.has_eh_frame ? ".eh_frame that cannot be read without a search table"
                                 : "no call-frame information";
  }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  // The walk ends at main, as gdb's backtrace does: what called it is the same in every stack
  // (libc's start-up, which is built without frame pointers), so its rows say kRowLast.
  const uint64_t main_pc = main_address(f.elf, eh);
  if (main_pc && std::binary_search(starts.begin(), starts.end(), main_pc)) out.main = main_pc;
  std::vector<Span> spans;
  for (size_t i = 0; i < starts.size(); i++) {
    const uint64_t stop = i + 1 < starts.size() ? starts[i + 1] : UINT64_MAX;
    uint64_t pc = starts[i];
    bool any = false;
    while (pc < stop) {
      Dwarf_Frame* frame;
      if (dwarf_cfi_addrframe(cfi, pc, &frame) != 0) break;
      std::unique_ptr<Dwarf_Frame, decltype(&free)> owned(frame, free);
      Dwarf_Addr lo, hi;
      bool signal = false;
      if (dwarf_frame_info(frame, &lo, &hi, &signal) < 0 || hi <= pc || lo > pc) break;
      // The signal trampoline's FDE starts a byte early, so that a lookup of its address - 1
      // finds it; the row covers that byte too.
      uint32_t r = rule_of(frame, signal);
      if (starts[i] == out.main)
        r = row_kind(r) == kRowRsp || row_kind(r) == kRowRbp ? r | kRowLast : rule(kRowEnd);
      if (row_kind(r) == kRowStop) out.stop_rows++;
      spans.push_back({pc, std::min<uint64_t>(hi, stop), r});
      if (starts[i] == out.main) out.main_end = spans.back().end;
      any = true;
      pc = hi;
    }
    out.fdes += any;
  }
  std::vector<Span> plt;
  for (const auto& p : s.plts) plt_spans(p, &plt);
  out.rows = to_rows(std::move(spans), std::move(plt));
  if (out.rows.empty() && out.problem.empty()) out.problem = "no usable call-frame information";
  return out;
}

}  // namespace memhook
