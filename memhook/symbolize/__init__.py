"""Return addresses to module, offset, function, file:line and inlined frames, from ELF symbol
tables and DWARF (pyelftools), on the capturing host or another one.

Finding a module's files (`Lookup`): the binary by --sysroot + path, then by path, then by
build-id in the store where memhook keeps a container's files (module_files.py); the debug file
by build-id under each debug directory (`.build-id/ab/cdef….debug`, as /usr/lib/debug lays them
out), then by the binary's .gnu_debuglink name next to it, in its .debug/ and in each debug
directory. A file is trusted only if its build-id matches the capture's. Everything is cached per
file; DWARF is read one compile unit at a time, when an address needs it.
"""
from __future__ import annotations

import bisect
import copy
import ctypes
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from elftools.common.exceptions import DWARFError, ELFError

from .. import _native
from ..common import disk_cache
from ..elf import module_files
from . import jit_frames, python_frames, symbol_cache

SYSTEM_DEBUG_DIR = "/usr/lib/debug"
ELF_ERRORS = (OSError, ELFError, DWARFError, KeyError, IndexError, ValueError, AttributeError,
              AssertionError, TypeError)  # pyelftools raises all of these on odd files


# A walk cut short ends with one of these (segment.h): the reason is the frame's name.
CUT_MARKERS = {_native.FRAME_NO_UNWIND_INFO: "[no unwind info]",
               _native.FRAME_UNWIND_STOPPED: "[unwind stopped]"}


@dataclass(frozen=True)
class Frame:
    address: int
    module: str | None
    offset: int | None
    function: str | None
    file: str | None
    line: int | None
    inlined: bool = False  # an inlined call inside the next frame (same address)

    def as_dict(self) -> dict:
        d = {"address": f"0x{self.address:x}", "module": self.module, "offset": self.offset,
             "function": self.function, "file": self.file, "line": self.line}
        if self.inlined:
            d["inlined"] = True
        return d


@lru_cache(maxsize=None)
def _cxa_demangle():
    try:  # (the soname first: find_library runs ldconfig, a subprocess)
        lib = ctypes.CDLL("libstdc++.so.6")
    except OSError:
        from ctypes.util import find_library
        try:
            lib = ctypes.CDLL(find_library("stdc++") or "libstdc++.so")
        except OSError:
            return None
    fn = lib.__cxa_demangle
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_int)]
    return fn


_libc = ctypes.CDLL(None)


# Rust's names: v0 (_R...), and legacy, which is C++'s form ending in a hash (17h<16 hex>E) that
# gdb leaves out, as it leaves out v0's crate hashes and LLVM's .llvm.N suffixes.
RUST_LEGACY = re.compile(r"_ZN.*17h[0-9a-f]{16}E(?:\.llvm\.[0-9]+)?")


class _RustDemangler:
    """binutils' c++filt (-i: as gdb names them, without hashes) kept running: one line in, one
    out, 0.07 ms a name. None of this when c++filt is missing: names stay as they are. Looked
    for at the first Rust name, not at import (subprocess is 4 ms of a report's start)."""

    def __init__(self):
        self.proc = None
        self.failed = False

    def __call__(self, name: str) -> str | None:
        if self.failed or "\n" in name:
            return None
        try:
            if self.proc is None:
                import subprocess
                if shutil.which("c++filt") is None:
                    self.failed = True
                    return None
                self.proc = subprocess.Popen(["c++filt", "-i"], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True, bufsize=1)
            self.proc.stdin.write(name + "\n")
            self.proc.stdin.flush()
            out = self.proc.stdout.readline().rstrip("\n")
        except (OSError, ValueError):
            self.failed = True
            return None
        return out or None


_rust_demangle = _RustDemangler()


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    if name.startswith("_R") or (name.startswith("_ZN") and RUST_LEGACY.fullmatch(name)):
        rust = _rust_demangle(name)
        if rust:
            return rust
    if not name.startswith("_Z"):
        return name
    return cxa_demangle(name) or name


@lru_cache(maxsize=65536)
def cxa_demangle(mangled: str) -> str | None:
    """What __cxa_demangle makes of a mangled name: a symbol ("_Z...") or a type as a type_info
    holds it ("N2ns3FooE" -> "ns::Foo"); None when it is neither."""
    fn = _cxa_demangle()
    if fn is None:
        return None
    status = ctypes.c_int(0)
    out = fn(mangled.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return None
    try:
        return ctypes.string_at(out).decode(errors="replace")
    finally:
        _libc.free(ctypes.c_void_p(out))


def _open(path: str):
    f = open(path, "rb")
    try:
        from elftools.elf.elffile import ELFFile  # (not imported for a report the cache answers)
        return ELFFile(f)
    except ELFError:
        f.close()
        raise


def _debuglink(elf) -> str | None:
    sec = elf.get_section_by_name(".gnu_debuglink")
    if sec is None:
        return None
    data = sec.data()
    return data[:data.index(b"\0")].decode(errors="replace") if b"\0" in data else None


@dataclass
class Lookup:
    debug_dirs: list = field(default_factory=list)
    sysroot: str | None = None

    def __post_init__(self):
        for d in self.debug_dirs:
            if not os.path.isdir(d) or not os.access(d, os.R_OK | os.X_OK):
                raise ValueError(f"debug directory {d} cannot be read")
        if self.sysroot and not os.path.isdir(self.sysroot):
            raise ValueError(f"sysroot {self.sysroot} is not a directory")

    def _dirs(self) -> list:
        return [*self.debug_dirs, SYSTEM_DEBUG_DIR]

    def find(self, module: dict, considered: list | None = None):
        """(binary ELF or None, debug ELF or None, problem or "") for a capture module record;
        every path looked at is added to `considered` (symbol_cache.py checks them again)."""
        want = module.get("build_id") or ""
        trusted = self._trusted
        if considered is not None:
            def trusted(path, *args, **kw):
                considered.append(path)
                return self._trusted(path, *args, **kw)
        path = module["path"].replace(" (deleted)", "")
        problems = []
        binary = None
        candidates = ([(os.path.join(self.sysroot, path.lstrip("/")), False)]
                      if self.sysroot else [])
        if path.startswith("/"):  # ([vdso]: no file, kept by build-id only)
            candidates.append((path, False))
        if want:
            candidates.append((module_files.stored_path(want), True))
        for cand, quiet in candidates:
            elf = trusted(cand, want, problems, quiet_missing=quiet)
            if elf is not None:
                binary = elf
                break
        debug = None
        if want:
            for d in self._dirs():
                debug = trusted(os.path.join(d, ".build-id", want[:2], want[2:] + ".debug"),
                                want, problems, quiet_missing=True)
                if debug is not None:
                    break
        if debug is None and binary is not None:
            link = _debuglink(binary)
            if link:
                here = os.path.dirname(binary.stream.name)
                places = [os.path.join(here, link), os.path.join(here, ".debug", link)]
                places += [os.path.join(d, os.path.dirname(path).lstrip("/"), link)
                           for d in self._dirs()]
                places += [os.path.join(d, link) for d in self._dirs()]
                for p in places:
                    debug = trusted(p, want, problems, quiet_missing=True)
                    if debug is not None:
                        break
        if binary is None and debug is None:
            return None, None, "; ".join(problems) or "file not found"
        return binary, debug, ""

    @staticmethod
    def _trusted(path: str, want: str, problems: list, quiet_missing: bool = False):
        if not os.path.isfile(path):
            if not quiet_missing:
                problems.append(f"{path}: not found")
            return None
        try:
            elf = _open(path)
        except ELF_ERRORS as e:
            problems.append(f"{path}: not readable as ELF ({type(e).__name__})")
            return None
        from ..elf.slots import build_id
        have = build_id(elf)
        if want and have != want:
            problems.append(f"{path}: build-id {have or 'missing'}, capture has {want}")
            elf.stream.close()
            return None
        return elf


def as_reported(frames: list) -> list:
    """(function, file, line) frames of a batch lookup as reports name them: mangled names
    demangled (by ours, where a tool's gave up), paths normalized."""
    return [(demangle(fn) if fn and fn.startswith("_Z") else fn, os.path.normpath(fl), ln)
            for fn, fl, ln in frames]


class LineTool:
    """file:line and inlined calls for many addresses in one run of a system symbolizer:
    llvm-symbolizer (JSON output) or GNU/elfutils addr2line. Much faster than pyelftools on
    large binaries; pyelftools remains the path that is always there."""

    CHOICES = ("auto", "libdw", "pyelftools", "llvm-symbolizer", "addr2line", "eu-addr2line")
    IN_PROCESS = ("auto", "libdw", "pyelftools")  # no LineTool: elfutils natively, or pyelftools

    def __init__(self, name: str, path: str):
        self.name, self.path = name, path

    @classmethod
    def find(cls, choice: str = "auto"):
        """The system symbolizer `choice` names; None for the in-process ones."""
        if choice in cls.IN_PROCESS:
            return None
        path = shutil.which(choice)
        if path is None:
            raise ValueError(f"{choice} is not installed")
        return cls(choice, path)

    def locate_many(self, elf_path: str, vaddrs: list) -> dict:
        """{vaddr: [(function, file, line)] innermost first}; addresses it cannot place are
        left out, and a tool that fails yields {} (pyelftools then answers)."""
        if not vaddrs:
            return {}
        query = "\n".join(f"0x{a:x}" for a in vaddrs) + "\n"
        if self.name == "llvm-symbolizer":
            cmd = [self.path, f"--obj={elf_path}", "--output-style=JSON", "--inlines",
                   "--demangle"]
        else:
            cmd = [self.path, "-a", "-f", "-i", "-C", "-e", elf_path]
        import subprocess
        try:
            out = subprocess.run(cmd, input=query, capture_output=True, text=True,
                                 timeout=600).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        return self._parse_json(out) if self.name == "llvm-symbolizer" else \
            self._parse_addr2line(out)

    @staticmethod
    def _parse_json(out: str) -> dict:
        found = {}
        for line in out.splitlines():
            try:
                rec = json.loads(line)
                addr = int(rec["Address"], 16)
                frames = [(f["FunctionName"] or None, f["FileName"] or None, f["Line"] or None)
                          for f in rec["Symbol"] if f["FileName"]]
            except (ValueError, KeyError, TypeError):
                continue
            if frames:  # (a name its demangler gave up on stays mangled: ours tries)
                found[addr] = as_reported(frames)
        return found

    @staticmethod
    def _parse_addr2line(out: str) -> dict:
        found, addr, pending = {}, None, []
        lines = out.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("0x") and (i + 1 < len(lines)) and not line.startswith("0x0 "):
                try:
                    addr = int(line, 16)
                    found.setdefault(addr, [])
                    continue
                except ValueError:
                    pass
            if addr is None:
                continue
            if not pending:
                pending = [line]
                continue
            fn = None if pending[0] == "??" else pending[0]
            fn = demangle(fn) if fn and fn.startswith("_Z") else fn
            file, _, ln = line.rpartition(":")
            ln = ln.split()[0] if ln else ""
            if file and file != "??" and ln.isdigit() and int(ln):
                found[addr].append((fn, os.path.normpath(file), int(ln)))
            pending = []
        return {a: f for a, f in found.items() if f}


SIGNAL_FRAME = "<signal handler called>"  # as gdb names the signal trampoline's frame


def _unwind_facts(binary):
    """What an object's unwind rows know that its symbols may not (hook_cpp/unwind/cfi_rows.cpp,
    rows cached by build-id): main's span in an executable, found from the entry point's call
    to __libc_start_main when main has no symbol ((0, 0) if none), and the signal trampoline's
    spans ([start, end) pairs, the byte before it included)."""
    try:
        from ..elf.slots import build_id
        from ..unwind import tables as unwind_tables
        r = unwind_tables.rows_for(binary.stream.name, build_id(binary), unwind_tables.cache_dir())
    except (OSError, RuntimeError):
        return (0, 0), []
    main = (r.info.get("main", 0), r.info.get("main_end", 0))
    rows = np.frombuffer(r.rows, dtype=np.uint32).reshape(-1, 2)
    at = np.flatnonzero((rows[:-1, 1] & 7) == _native.ROW_SIGNAL)
    return main, [(int(rows[i, 0]), int(rows[i + 1, 0])) for i in at]


ENTRY_STUB = 64  # bytes of an unnamed entry point's code taken as "_start" (RTLD_START's: 61)


def _entry_stub(binary, starts, ends) -> tuple | None:
    """An object whose entry point no symbol covers (the dynamic loader stripped of .symtab,
    where every constructor's stack starts) gets "_start" there, as gdb names it: up to the
    next symbol, at most ENTRY_STUB bytes. (start, end, "_start"), or None."""
    entry = binary.header["e_entry"]
    if not entry or np.any((starts <= entry) & (entry < ends)):
        return None
    i = int(np.searchsorted(starts, entry, side="right"))
    after = int(starts[i]) if i < len(starts) else entry + ENTRY_STUB
    return entry, entry + min(after - entry, ENTRY_STUB), "_start"


def _with(starts, ends, names: list, extra: tuple):
    """The table with (start, end, name) in it, in place of any function at that start."""
    keep = starts != extra[0]
    at = int(np.searchsorted(starts[keep], extra[0]))
    names = [n for n, k in zip(names, keep.tolist()) if k] if not keep.all() else list(names)
    names.insert(at, extra[2])
    return (np.insert(starts[keep], at, np.uint64(extra[0])),
            np.insert(ends[keep], at, np.uint64(extra[1])), names)


def without_root_marker(frames: list) -> list:
    """A stack's frames without the "[no unwind info]" marker right after `_start`: the
    entry point is the stack's true root (hand-written, without CFI), nothing was cut."""
    return [f for i, f in enumerate(frames) if not (
        i and f.get("function") == CUT_MARKERS.get(_native.FRAME_NO_UNWIND_INFO)
        and not f.get("module") and frames[i - 1].get("function") == "_start")]


class ModuleSymbols:
    """Function names (symbol tables of the binary and its debug file) and DWARF lines and
    inlined calls, addressed by ELF virtual address. Both are read natively (elfutils:
    hook_cpp/symbolize/module_symbols.h); with `native_lines` False the lines come from
    pyelftools, one compile unit at a time (--symbolizer pyelftools), or from a LineTool."""

    def __init__(self, binary, debug, native_lines: bool = True):
        files = [elf.stream.name for elf in (debug, binary) if elf is not None]
        # (sorted by start, one name per start: module_symbols.h)
        starts, ends, names = _native.function_table(files)
        self.signal_spans = []
        if binary is not None:
            (lo, hi), self.signal_spans = _unwind_facts(binary)
            if lo and "main" not in names:
                starts, ends, names = _with(starts, ends, names, (lo, hi, "main"))
            stub = _entry_stub(binary, starts, ends)
            if stub:
                starts, ends, names = _with(starts, ends, names, stub)
        dwarf_path = None
        self.dwarf = None
        self.lines = None       # the native DWARF reader
        for elf in (debug, binary):
            if elf is not None and elf.has_dwarf_info():
                if native_lines:
                    lines = _native.DwarfLines(elf.stream.name)
                    if not lines.ok:
                        continue
                    self.lines = lines
                else:
                    try:
                        self.dwarf = elf.get_dwarf_info()
                    except ELF_ERRORS:
                        continue
                    self._dwarf_file = elf.stream  # read on demand: closed with these tables
                dwarf_path = elf.stream.name
                break
        self._tables(starts, ends, names, dwarf_path, {}, None, -1)

    def _tables(self, starts, ends, names, dwarf_path, located: dict, considered,
                stored: int) -> None:
        """What a build and the cache on disk both give."""
        self.starts, self.ends, self.names = starts, ends, names
        self.dwarf_path = dwarf_path  # the file that holds the DWARF, for a LineTool
        self._units: dict = {}
        self._cu_ranges = None
        self.located = located        # vaddr -> frames, from a batch (native or a LineTool's)
        self.named: dict = {}         # vaddr -> function(), from a batch
        self.considered = considered  # [[path, signature]] when kept in symbol_cache
        self.stored = stored          # len(located) when last kept there

    def __del__(self):
        f = getattr(self, "_dwarf_file", None)
        if f is not None:
            f.close()

    @classmethod
    def from_entry(cls, entry: "symbol_cache.Entry") -> "ModuleSymbols":
        """From the cache on disk: the DWARF file opened only for an address not placed yet."""
        self = cls.__new__(cls)
        self.signal_spans = entry.signal_spans
        self.dwarf = self.lines = None
        self._tables(entry.starts, entry.ends, entry.names, entry.dwarf_path, entry.located,
                     entry.considered, len(entry.located))
        return self

    def entry(self) -> "symbol_cache.Entry":
        return symbol_cache.Entry(self.starts, self.ends, self.names, self.signal_spans,
                                  self.dwarf_path, self.located, self.considered)

    def _open_lines(self) -> bool:
        """The native DWARF reader, opened now if this came from the cache."""
        if self.lines is None and self.considered is not None and self.dwarf_path:
            lines = _native.DwarfLines(self.dwarf_path)
            if lines.ok:
                self.lines = lines
            else:
                self.dwarf_path = None
        return self.lines is not None

    def locate_many(self, vaddrs: list) -> None:
        """Look many addresses up natively at once (frames as LineTool gives them)."""
        vaddrs = [a for a in vaddrs if a not in self.located]
        if not vaddrs or not self._open_lines():
            return
        for vaddr, frames in self.lines.locate(vaddrs).items():
            self.located[vaddr] = as_reported([f for f in frames if f[1]])

    def function(self, vaddr: int) -> str | None:
        if self.signal_spans and any(lo <= vaddr < hi for lo, hi in self.signal_spans):
            return SIGNAL_FRAME
        if vaddr in self.named:
            return self.named[vaddr]
        i = int(np.searchsorted(self.starts, vaddr, side="right")) - 1
        if i >= 0 and vaddr < int(self.ends[i]):
            return demangle(self.names[i])
        return None

    def name_many(self, vaddrs: list) -> None:
        """function() of many addresses at once: one search of the table for all of them."""
        if not len(self.starts) or not vaddrs:
            return
        at = np.asarray(vaddrs, np.uint64)
        i = np.searchsorted(self.starts, at, side="right").astype(np.int64) - 1
        inside = (i >= 0) & (at < self.ends[np.maximum(i, 0)])
        for vaddr, k, ok in zip(vaddrs, i.tolist(), inside.tolist()):
            self.named[vaddr] = demangle(self.names[k]) if ok else None

    # -- DWARF, one compile unit at a time --

    def _cu_offset(self, vaddr: int):
        try:
            ar = self.dwarf.get_aranges()
            if ar is not None:
                off = ar.cu_offset_at_addr(vaddr)
                if off is not None:
                    return off
        except ELF_ERRORS:
            pass
        if self._cu_ranges is None:  # no aranges: the top DIE of each unit says its ranges
            self._cu_ranges = []
            for cu in self.dwarf.iter_CUs():
                for lo, hi in _die_ranges(self.dwarf, cu.get_top_DIE(), 0):
                    self._cu_ranges.append((lo, hi, cu.cu_offset))
        for lo, hi, off in self._cu_ranges:
            if lo <= vaddr < hi:
                return off
        return None

    def _unit(self, offset: int):
        if offset not in self._units:
            try:
                self._units[offset] = _Unit(self.dwarf, self.dwarf.get_CU_at(offset))
            except ELF_ERRORS:
                self._units[offset] = None
        return self._units[offset]

    def locate(self, vaddr: int) -> list:
        """[(function or None, file, line)] innermost first; [] without DWARF for vaddr."""
        if vaddr in self.located:
            return self.located[vaddr]
        if self._open_lines():
            self.locate_many([vaddr])
            return self.located.setdefault(vaddr, [])
        if self.dwarf is None:
            return []
        try:
            off = self._cu_offset(vaddr)
            unit = self._unit(off) if off is not None else None
            return unit.locate(vaddr) if unit else []
        except ELF_ERRORS:
            return []


def _die_ranges(dwarf, die, cu_base: int) -> list:
    a = die.attributes
    if "DW_AT_low_pc" in a and "DW_AT_high_pc" in a:
        lo = a["DW_AT_low_pc"].value
        hi = a["DW_AT_high_pc"]
        end = hi.value if hi.form == "DW_FORM_addr" else lo + hi.value
        return [(lo, end)]
    if "DW_AT_ranges" in a:
        rl = dwarf.range_lists()
        if rl is None:
            return []
        entries = rl.get_range_list_at_offset(a["DW_AT_ranges"].value, cu=die.cu)
        out = []
        base = cu_base
        for e in entries:
            name = type(e).__name__
            if name == "BaseAddressEntry":
                base = e.base_address
            elif hasattr(e, "begin_offset"):
                absolute = getattr(e, "is_absolute", False)
                lo = e.begin_offset + (0 if absolute else base)
                hi = e.end_offset + (0 if absolute else base)
                if hi > lo:
                    out.append((lo, hi))
        return out
    return []


class _Unit:
    """One compile unit: its line table and its functions and inlined calls by address."""

    def __init__(self, dwarf, cu):
        top = cu.get_top_DIE()
        comp_dir = top.attributes.get("DW_AT_comp_dir")
        self.comp_dir = comp_dir.value.decode(errors="replace") if comp_dir else ""
        base = top.attributes.get("DW_AT_low_pc")
        base = base.value if base else 0
        lp = dwarf.line_program_for_CU(cu)
        self.files = _file_names(lp, self.comp_dir) if lp else {}
        rows = []
        if lp is not None:
            for entry in lp.get_entries():
                st = entry.state
                if st is not None:
                    rows.append((st.address, None if st.end_sequence else (st.file, st.line)))
        rows.sort(key=lambda r: (r[0], r[1] is not None))
        self.line_addrs = [r[0] for r in rows]
        self.line_rows = [r[1] for r in rows]
        # (lo, hi, depth, die) for every function and inlined call with code
        self.scopes = []
        for die in cu.iter_DIEs():
            if die.tag in ("DW_TAG_subprogram", "DW_TAG_inlined_subroutine"):
                depth = 0
                p = die.get_parent()
                while p is not None:
                    depth += 1
                    p = p.get_parent()
                for lo, hi in _die_ranges(dwarf, die, base):
                    self.scopes.append((lo, hi, depth, die))

    def _line(self, vaddr: int):
        i = bisect.bisect_right(self.line_addrs, vaddr) - 1
        row = self.line_rows[i] if i >= 0 else None
        return (self.files.get(row[0]), row[1]) if row else (None, None)

    def locate(self, vaddr: int) -> list:
        scopes = sorted((s for s in self.scopes if s[0] <= vaddr < s[1]), key=lambda s: -s[2])
        file, line = self._line(vaddr)
        out = []
        for _, _, _, die in scopes:
            out.append((_die_name(die), file, line))
            if die.tag != "DW_TAG_inlined_subroutine":
                break
            a = die.attributes
            cf = a.get("DW_AT_call_file")
            file = self.files.get(cf.value) if cf else None
            line = a["DW_AT_call_line"].value if "DW_AT_call_line" in a else None
        if not out and file:
            out.append((None, file, line))
        return out


def _die_name(die, hops: int = 0):
    a = die.attributes
    for key in ("DW_AT_linkage_name", "DW_AT_MIPS_linkage_name"):
        if key in a:
            return demangle(a[key].value.decode(errors="replace"))
    for key in ("DW_AT_abstract_origin", "DW_AT_specification"):
        if key in a and hops < 4:
            try:
                name = _die_name(die.get_DIE_from_attribute(key), hops + 1)
            except ELF_ERRORS:
                name = None
            if name:
                return name
    if "DW_AT_name" in a:
        return a["DW_AT_name"].value.decode(errors="replace")
    return None


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


class Symbolizer:
    """Resolves return addresses against a capture's module table."""

    def __init__(self, modules, lookup: Lookup | None = None, tool: str = "auto",
                 cache: dict | None = None, python_code: dict | None = None, depth: int = 0):
        """`cache`: per-file symbols shared with other symbolizers of the same thread (the
        processes of one run map the same files; pyelftools' readers are not thread-safe).
        `python_code`: the capture's code records (its Python frames' names); `depth`: the
        native frames its walks stopped at (0: unknown)."""
        self.python_code = python_code if python_code is not None else {}
        self.depth = depth or _native.MAX_DEPTH
        self.jit_entries: list = []  # a perf map's [start, size, name] (jit_frames.py)
        self._jit = None
        # module path -> (starts, [[start, end]]) of functions unwound by rows derived from
        # their machine code (by start)
        self.derived: dict = {}
        self.line_tool = LineTool.find(tool)
        self.native_lines = tool in ("auto", "libdw")
        self.lookup = lookup or Lookup()
        self._symbols: dict = {} if cache is None else cache  # (path, build-id) -> (syms, why)
        self.problems: dict = {}  # module path -> why it could not be symbolized
        self.set_modules(modules)

    def for_modules(self, modules) -> "Symbolizer":
        """Another module table (another process of the same run or capture), with this one's
        lookup, line tool and per-file symbols (use() gives it its capture's code records)."""
        other = copy.copy(self)  # (shares lookup, line tool and the per-file symbols dict)
        other.problems = {}
        other.set_modules(modules)
        return other

    def use(self, cap) -> "Symbolizer":
        """A capture's code records and walk depth (its Python frames' names and places) and
        its perf map (its JIT frames' names)."""
        self.python_code = cap.python_code
        self.depth = int(cap.meta.get("depth") or 0) or _native.MAX_DEPTH
        self.use_jit_entries(cap.jit_map.get("entries") or [])
        self.derived = {path: ([int(r[0]) for r in ranges], ranges) for path, _, ranges in
                        (cap.meta.get("unwind") or {}).get("derived") or [] if ranges}
        self._native_stacks = {}  # (marked by the derived rows in use)
        return self

    def use_jit_entries(self, entries: list) -> None:
        """A perf map's entries (a live session's list, which grows)."""
        if entries is not self.jit_entries and (entries or self.jit_entries):
            self.jit_entries, self._jit = entries, None
            self._forget_unmoduled()

    def _forget_unmoduled(self) -> None:
        """Frames of addresses in no module, named before the perf map had them."""
        self._dicts = {a: d for a, d in self._dicts.items() if self._module_of(a)}
        self._cache = {a: f for a, f in self._cache.items() if self._module_of(a)}
        self._native_stacks = {}

    def _jit_entry(self, address: int):
        if not self.jit_entries:
            return None
        if self._jit is None or len(self._jit) != len(self.jit_entries):
            from ..capture.perf_map import JitMap  # (a JIT runtime's capture only)
            self._jit = JitMap(self.jit_entries)
            self._forget_unmoduled()
        return self._jit.at(address)

    def set_modules(self, modules) -> None:
        """A new module table (libraries came or went); per-file symbols are kept."""
        self.modules = sorted((m if isinstance(m, dict) else vars(m) for m in modules),
                              key=lambda m: m["lo"])
        self._los = [m["lo"] for m in self.modules]
        self._cache: dict = {}
        self._dicts: dict = {}
        self._native_stacks: dict = {}
        self._python_for, self._python_dicts = None, {}

    def _module_symbols(self, module: dict):
        key = (module["path"], module.get("build_id"))
        if key not in self._symbols:
            cached = self.native_lines and self.line_tool is None
            entry = symbol_cache.load(module, self.lookup) if cached else None
            syms, problem = (ModuleSymbols.from_entry(entry), "") if entry else (None, "")
            if syms is None:
                considered: list = []
                binary, debug, problem = self.lookup.find(module, considered)
                if not problem:
                    try:
                        syms = ModuleSymbols(binary, debug, self.native_lines)
                    except ELF_ERRORS as e:
                        problem = f"unreadable symbols ({type(e).__name__})"
                # Files closed now, not by the garbage collector (whose ResourceWarning can
                # surface anywhere): all but the one whose DWARF pyelftools reads on demand.
                for elf in {id(e): e for e in (binary, debug) if e is not None}.values():
                    if syms is None or syms.dwarf is None or elf.stream.name != syms.dwarf_path:
                        elf.stream.close()
                if syms is not None and cached:
                    syms.considered = [[p, disk_cache.file_signature(p)] for p in considered]
            self._symbols[key] = (syms, problem)
        syms, problem = self._symbols[key]
        if problem:
            self.problems[module["path"]] = problem
        return syms

    def _module_of(self, address: int):
        i = bisect.bisect_right(self._los, address) - 1
        return self.modules[i] if i >= 0 and address < self.modules[i]["hi"] else None

    def prepare(self, addresses) -> None:
        """Look many addresses up at once: natively, or one LineTool run per module file."""
        if self.line_tool is None and not self.native_lines:
            return
        by_module: dict = {}  # id(module) -> (module, its addresses not looked up yet)
        if isinstance(addresses, np.ndarray):  # (a report's stacks at once: 5 M frames)
            unique = np.sort(addresses.astype(np.uint64, copy=False))  # (np.unique imports
            unique = unique[np.diff(unique, prepend=np.uint64(1) ^ unique[:1]) != 0]  # numpy.ma)
            unique = set(unique[(unique >> np.uint64(63)) == 0].tolist())  # (no Python words)
        else:
            unique = set(int(x) for x in addresses)
        for a in unique - self._dicts.keys():
            m = self._module_of(a)
            if m is not None and a not in CUT_MARKERS:
                by_module.setdefault(id(m), (m, []))[1].append(a)
        loud = sys.stderr.isatty() and sum(len(v) for _, v in by_module.values()) >= 2000
        for m, addresses in by_module.values():
            syms = self._module_symbols(m)
            if syms is None:
                continue
            vaddrs = [a - m["bias"] - 1 for a in addresses]  # (the call, before the return)
            syms.name_many(vaddrs)
            if self.line_tool is None:
                syms.locate_many(vaddrs)
                if syms.considered is not None and syms.stored != len(syms.located):
                    symbol_cache.store(m, self.lookup, syms.entry())
                    syms.stored = len(syms.located)
            elif syms.dwarf_path:
                if loud:
                    print(f"\rmemhook: symbolizing {len(vaddrs)} addresses in "
                          f"{os.path.basename(m['path'])} ({self.line_tool.name})\x1b[K", end="",
                          file=sys.stderr, flush=True)
                syms.located.update(self.line_tool.locate_many(syms.dwarf_path, vaddrs))
            dicts = self._dicts
            if self.line_tool is not None:
                for a in addresses:  # every frame now, the module known: as reports hold them
                    dicts[a] = self._dicts_in(a, m, syms)
                continue
            # Everything looked up above: read straight from the tables (44,000 addresses of
            # a 10,000-stack report in libc, 0.1 s less than through locate() and function()).
            located, named, path = syms.located, syms.named, m["path"]
            in_signal = np.zeros(len(vaddrs), bool)
            if syms.signal_spans:
                at_ = np.asarray(vaddrs, np.uint64)
                for lo, hi in syms.signal_spans:
                    in_signal |= (at_ >= lo) & (at_ < hi)
            for a, vaddr, signal_frame in zip(addresses, vaddrs, in_signal.tolist()):
                where = located.get(vaddr)
                if where is None:
                    dicts[a] = self._dicts_in(a, m, syms)
                    continue
                dicts[a] = frame_dicts_of(a, path, vaddr + 1, where,
                                          SIGNAL_FRAME if signal_frame else named.get(vaddr))
        if loud:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)

    def frames(self, address: int) -> list:
        """The frames at one return address, innermost (inlined) first (frame_dicts' frames, as
        Frame objects)."""
        got = self._cache.get(address)
        if got is None:
            got = self._cache[address] = [
                Frame(address, d["module"], d["offset"], d["function"], d["file"], d["line"],
                      d.get("inlined", False)) for d in self.frame_dicts(address)]
        return got

    @staticmethod
    def _dicts_in(address: int, module: dict, syms) -> list:
        """The frames at an address of `module`, as reports hold them."""
        vaddr = address - module["bias"]
        # A return address points after the call: look up the call instruction itself.
        return frame_dicts_of(address, module["path"], vaddr,
                              syms.locate(vaddr - 1) if syms else [],
                              syms.function(vaddr - 1) if syms else None)

    def frame_dicts(self, address: int) -> list:
        """The frames at one return address as reports hold them (Frame.as_dict's dicts), innermost
        first, made once (shared: callers do not change them)."""
        got = self._dicts.get(address)
        if got is None:
            module = self._module_of(address)
            if address in CUT_MARKERS:
                got = frame_dicts_of(address, None, None, [], CUT_MARKERS[address])
            elif module is None:
                entry = self._jit_entry(address)
                got = [jit_frames.frame_dict(address, entry)] if entry else \
                    [jit_frames.unlisted(address)] if self.jit_entries else \
                    frame_dicts_of(address, None, None, [], None)
            else:
                got = self._dicts_in(address, module, self._module_symbols(module))
            self._dicts[address] = got
        return got

    def native_frames(self, native: list, with_calls: bool = False) -> tuple[list, list | None]:
        """A stack's native frames' dicts, and (`with_calls`: a stack with Python frames) where
        the evaluator's are among them: made once per native stack (a Python program's many
        stacks share few: they differ in their Python frames). The list is the caller's; the
        dicts are shared."""
        key = tuple(native)
        got = self._native_stacks.get(key)
        if got is None:
            out: list = []
            for x in native:
                out += self.frame_dicts(x)
            if self.derived:
                mark_derived(out, self.derived)
            got = self._native_stacks[key] = [out, None]
        if with_calls and got[1] is None:
            got[1] = [i for i, d in enumerate(got[0]) if python_frames.is_eval(d)]
        return list(got[0]), got[1]

    def python_dicts(self) -> dict:
        """The Python frames named so far, by word, for the code records in use."""
        if self._python_for is not self.python_code:
            self._python_for, self._python_dicts = self.python_code, {}
        return self._python_dicts

    def frame(self, address: int) -> Frame:
        """The outermost frame at an address (the function the return address is in)."""
        return self.frames(address)[-1]


def frame_dicts_of(address: int, path: str, offset: int, where: list, outer) -> list:
    """The frames at a return address as reports hold them (Frame.as_dict's keys, in its
    order): `where`, the (function, file, line) rows innermost first; `outer`, the symbol table's
    name of the function the address is in."""
    at = f"0x{address:x}"
    if not where:
        return [{"address": at, "module": path, "offset": offset, "function": outer,
                 "file": None, "line": None}]
    out = [{"address": at, "module": path, "offset": offset, "function": name, "file": f,
            "line": ln, "inlined": True} for name, f, ln in where[:-1]]
    name, f, ln = where[-1]
    out.append({"address": at, "module": path, "offset": offset, "function": outer or name,
                "file": f, "line": ln})
    return out


def stack_frames(symbolizer: "Symbolizer", addresses) -> list[dict]:
    """A stack's frames as reports hold them (dicts, inlined frames included), innermost first:
    the dicts made once per address, shared by every stack through it (reports only read
    them: `attributed_frame` goes on the stack)."""
    addresses = [int(x) for x in addresses] if not hasattr(addresses, "tolist") \
        else addresses.tolist()
    native, words = python_frames.split(addresses)
    out, calls = symbolizer.native_frames(native, with_calls=bool(words))
    if words:
        out = python_frames.interleave(out, words, symbolizer.python_code,
                                       native_cut=len(native) >= symbolizer.depth,
                                       calls=calls, cache=symbolizer.python_dicts())
    return without_root_marker(out) if _native.FRAME_NO_UNWIND_INFO in addresses else out


def mark_derived(frames: list, derived: dict) -> None:
    """Frames of functions the hooks unwound by rows derived from their machine code
    (prologue_rows.py) say so: "unwound": "derived rows" (the same for every stack through
    an address: the shared dicts are marked once)."""
    for f in frames:
        starts, ranges = derived.get(f.get("module")) or ((), ())
        if starts and f.get("offset") is not None and "unwound" not in f and not f.get("inlined"):
            at = f["offset"] - 1
            i = bisect.bisect_right(starts, at) - 1
            if i >= 0 and at < ranges[i][1]:
                f["unwound"] = "derived rows"
