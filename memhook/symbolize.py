"""Return addresses to module, offset, function and file:line, from ELF symbol tables and DWARF
line programs (pyelftools). Everything is cached per module file."""
from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from elftools.common.exceptions import DWARFError, ELFError
from elftools.elf.elffile import ELFFile


@dataclass(frozen=True)
class Frame:
    address: int
    module: str | None
    offset: int | None
    function: str | None
    file: str | None
    line: int | None

    def as_dict(self) -> dict:
        return {"address": f"0x{self.address:x}", "module": self.module, "offset": self.offset,
                "function": self.function, "file": self.file, "line": self.line}


@lru_cache(maxsize=None)
def _cxa_demangle():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
    except OSError:
        return None
    fn = lib.__cxa_demangle
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_int)]
    return fn


_libc = ctypes.CDLL(None)


def demangle(name: str) -> str:
    fn = _cxa_demangle()
    if fn is None or not name.startswith("_Z"):
        return name
    status = ctypes.c_int(0)
    out = fn(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return name
    try:
        return ctypes.string_at(out).decode(errors="replace")
    finally:
        _libc.free(ctypes.c_void_p(out))


class ModuleSymbols:
    """Function names and line table of one ELF file, addressed by virtual address."""

    def __init__(self, path: str):
        self.starts = np.zeros(0, dtype=np.uint64)
        self.ends = np.zeros(0, dtype=np.uint64)
        self.names: list[str] = []
        self.line_addrs: list[int] = []
        self.line_rows: list = []  # (file, line) or None at an end of sequence
        with open(path, "rb") as f:
            elf = ELFFile(f)
            self._read_symbols(elf)
            debug = elf if elf.has_dwarf_info() else _separate_debug(elf)
            if debug is not None:
                try:
                    self._read_lines(debug)
                except (DWARFError, ELFError, KeyError, IndexError, AttributeError):
                    self.line_addrs, self.line_rows = [], []

    def _read_symbols(self, elf) -> None:
        funcs = {}
        for name in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(name)
            if sec is None:
                continue
            for sym in sec.iter_symbols():
                if (sym["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC") and sym["st_value"]
                        and sym.name and sym["st_value"] not in funcs):
                    funcs[sym["st_value"]] = (max(sym["st_size"], 1), sym.name)
        order = sorted(funcs)
        self.starts = np.array(order, dtype=np.uint64)
        self.ends = np.array([a + funcs[a][0] for a in order], dtype=np.uint64)
        self.names = [funcs[a][1] for a in order]

    def _read_lines(self, elf) -> None:
        dwarf = elf.get_dwarf_info()
        rows = []
        for cu in dwarf.iter_CUs():
            lp = dwarf.line_program_for_CU(cu)
            if lp is None:
                continue
            comp_dir = cu.get_top_DIE().attributes.get("DW_AT_comp_dir")
            comp_dir = comp_dir.value.decode(errors="replace") if comp_dir else ""
            names = _file_names(lp, comp_dir)
            for entry in lp.get_entries():
                st = entry.state
                if st is None:
                    continue
                rows.append((st.address, None if st.end_sequence else
                             (names.get(st.file), st.line)))
        rows.sort(key=lambda r: (r[0], r[1] is not None))
        self.line_addrs = [r[0] for r in rows]
        self.line_rows = [r[1] for r in rows]

    def function(self, vaddr: int) -> str | None:
        i = int(np.searchsorted(self.starts, vaddr, side="right")) - 1
        if i >= 0 and vaddr < int(self.ends[i]):
            return demangle(self.names[i])
        return None

    def line(self, vaddr: int):
        i = bisect.bisect_right(self.line_addrs, vaddr) - 1
        return self.line_rows[i] if i >= 0 else None


def _file_names(lp, comp_dir: str) -> dict:
    header = lp.header
    v5 = header["version"] >= 5
    dirs = [d.decode(errors="replace") if isinstance(d, bytes) else str(d)
            for d in header["include_directory"]]
    out = {}
    for i, fe in enumerate(header["file_entry"]):
        name = fe.name.decode(errors="replace") if isinstance(fe.name, bytes) else str(fe.name)
        d = fe.dir_index
        if v5:
            base = dirs[d] if d < len(dirs) else comp_dir
        else:
            base = dirs[d - 1] if 0 < d <= len(dirs) else comp_dir
        if not os.path.isabs(name) and base:
            name = os.path.join(base if os.path.isabs(base) else os.path.join(comp_dir, base), name)
        out[i if v5 else i + 1] = os.path.normpath(name)
    return out


def _separate_debug(elf):
    """The distribution's debug file for this build-id (/usr/lib/debug/.build-id/ab/cdef.debug)."""
    from .elf import build_id
    bid = build_id(elf)
    path = f"/usr/lib/debug/.build-id/{bid[:2]}/{bid[2:]}.debug" if bid else ""
    if not path or not os.path.exists(path):
        return None
    try:
        return ELFFile(open(path, "rb"))
    except (OSError, ELFError):
        return None


class Symbolizer:
    """Resolves return addresses against a module table (from elf.modules or a capture)."""

    def __init__(self, modules):
        self.modules = sorted(modules, key=lambda m: m.lo)
        self._los = [m.lo for m in self.modules]
        self._symbols: dict = {}
        self._cache: dict = {}

    def _module_symbols(self, path: str):
        if path not in self._symbols:
            try:
                self._symbols[path] = ModuleSymbols(path)
            except (OSError, ELFError, DWARFError):
                self._symbols[path] = None
        return self._symbols[path]

    def frame(self, address: int) -> Frame:
        if address in self._cache:
            return self._cache[address]
        i = bisect.bisect_right(self._los, address) - 1
        module = self.modules[i] if i >= 0 and address < self.modules[i].hi else None
        if module is None:
            frame = Frame(address, None, None, None, None, None)
        else:
            vaddr = address - module.bias
            syms = self._module_symbols(module.path)
            # A return address points after the call: look up the call instruction itself.
            function = syms.function(vaddr - 1) if syms else None
            row = syms.line(vaddr - 1) if syms else None
            frame = Frame(address, module.path, vaddr, function,
                          row[0] if row else None, row[1] if row else None)
        self._cache[address] = frame
        return frame
