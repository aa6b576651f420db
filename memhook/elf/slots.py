"""Finding the slots: every relocation, in every object loaded in the target, that stores the
address of a hooked function (JUMP_SLOT, GLOB_DAT, R_X86_64_64), and where the real functions are.

Objects come from the dynamic linker's own list (r_debug via DT_DEBUG), in its search order; each
object's load bias is computed from its program headers and its mappings in /proc/PID/maps, and
checked against the list. Files are read through /proc/PID/map_files, so what is parsed is the
very file the target mapped (even if replaced on disk or in another mount namespace).
"""
from __future__ import annotations

import ctypes
import functools
import io
import mmap
import os
import re
from dataclasses import dataclass, field

import numpy as np
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..common import arch
from ..common.procfs import Mapping, Memory, TargetError, read_maps
from . import allocators, hooks, module_files
from .allocators import ELF64_SYM, STT_FUNC

PAGE = mmap.PAGESIZE  # the kernel's: 4 KiB on x86-64; 4, 16 or 64 KiB on AArch64
DT_NULL, DT_DEBUG = 0, 21
DT_PLTRELSZ, DT_RELA, DT_RELASZ, DT_JMPREL = 2, 7, 8, 23
HOOK_LIBRARY_NAME = "libmemhook_hook.so"
STB_GLOBAL, STB_WEAK = 1, 2
HELPERS = {"dlerror", "__libc_dlopen_mode", "munmap", "malloc_trim"}  # the agent calls these too
# Objects whose allocation functions are the ones memhook's slots are made for: the libcs, their
# loaders, the C++ runtimes' operator new, memhook's own library.
OWN_ALLOCATOR = re.compile(r"^(libc[.-]|ld-linux|ld-musl|libstdc\+\+|libc\+\+|libmemhook)")


@dataclass
class Slot:
    addr: int
    hook_id: int
    symbol: str
    reloc: str
    module: str
    readonly: bool = False  # in the object's RELRO region: read-only once relocated


@dataclass
class LoadedObject:
    path: str          # as the target sees it
    file: str          # where memhook reads it
    bias: int
    lo: int
    hi: int
    build_id: str = ""
    plt: list = field(default_factory=list)   # [(lo, hi)] of .plt/.plt.sec: lazy slots point here
    slots: list = field(default_factory=list)
    skip: str = ""     # why memhook leaves it alone ("" = patch it)
    defined: dict = field(default_factory=dict)  # hooked symbol -> absolute address, if defined
    libc: bool = False
    exported: set = field(default_factory=set)  # its .dynsym's allocation functions (any family)
    allocators: list = field(default_factory=list)  # allocators.Found: what else it defines


@dataclass
class Layout:
    objects: list
    real: dict         # hook id -> address of the function the dynamic linker binds
    dlopen: int        # function memhook calls to load its library
    dlopen_mode: int   # extra mode bits that function needs
    dlerror: int
    munmap: int        # what a failed dlopen left mapped is unmapped with it
    # A memhook library an earlier attach loaded, or 0 and "": the one a session reuses (the
    # first, until Session.attach picks the copy of its own build among `hook_libraries`)
    hook_library_base: int
    hook_library_file: str
    libc: str = "glibc"     # "glibc" or "musl": which hook library the target can load
    libc_version: str = ""  # as the libc file states it ("2.31", "1.2.3"), "" if it does not
    # The program's own suppressions (`const char* __lsan_default_suppressions()`, which LSan
    # and heaptrack read too), defined in the executable: its address, or 0
    embedded_suppressions: int = 0
    # Every memhook library loaded, (base, file), in load order: each memhook build loads its
    # own, and each copy takes the target's static TLS for good (a few fit)
    hook_libraries: list = field(default_factory=list)

    @property
    def slots(self) -> list:
        return [s for o in self.objects if not o.skip for s in o.slots]

    @property
    def allocators(self) -> list:
        """Allocation functions defined beside libc's, and how calls reach them."""
        return [f for o in self.objects for f in o.allocators]


def _open_elf(path: str):
    f = open(path, "rb")
    try:
        return f, ELFFile(f)
    except ELFError:
        f.close()
        raise


def is_libc(path: str) -> bool:
    """glibc's libc by its file name: libc.so.6, or before 2.34 libc-2.X.so."""
    return re.fullmatch(r"libc(-\d+(\.\d+)*)?\.so(\.\d+)*", os.path.basename(path)) is not None


# The oldest of each that the hook library loads into (hook_cpp/hook_library/libc.h).
BASELINE = {"glibc": (2, 17), "musl": (1, 2)}
# Where each states its version: glibc's banner (gnu_get_libc_version's string is beside it) and
# musl's version string, which its loader prints after "Version" (one per file).
_VERSION_TEXT = {"glibc": re.compile(rb"GNU C Library [^\0\n]{0,80}? version (\d+\.\d+(?:\.\d+)?)"),
                 "musl": re.compile(rb"\0(1\.\d+\.\d+)\0")}


def libc_version(kind: str, file: str) -> str:
    """The version the libc file states, or ""."""
    try:
        with open(file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if kind == "musl" and m.find(b"musl libc") < 0:
                return ""
            found = _VERSION_TEXT[kind].search(m)
            return found.group(1).decode() if found else ""
    except (OSError, ValueError):
        return ""


def baseline_problem(kind: str, version: str) -> str:
    """One line if this libc is older than the hook library loads into, else ""."""
    if not version or tuple(int(x) for x in version.split(".")[:2]) >= BASELINE[kind]:
        return ""
    return (f"the target's {kind} is {version}; memhook's hook library needs {kind} "
            f"{'.'.join(map(str, BASELINE[kind]))} or newer")


def _headers(elf, p_type: str | None = None) -> list:
    """Program headers (of one type), without building pyelftools' segment objects: its
    PT_DYNAMIC segment parses the whole dynamic table on creation, most of an attach's scan."""
    return [h for h in (elf._get_segment_header(i) for i in range(elf.num_segments()))
            if p_type is None or h.p_type == p_type]


def _segments(elf, p_type: str) -> list:
    """The segment objects of one type (notes, the interpreter: small to build)."""
    return [elf.get_segment(i) for i in range(elf.num_segments())
            if elf._get_segment_header(i).p_type == p_type]


def _loads(elf) -> list:
    return _headers(elf, "PT_LOAD")


def build_id(elf) -> str:
    for seg in _segments(elf, "PT_NOTE"):
        for note in seg.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return note["n_desc"]
    return ""


def _bias_from_maps(elf, maps: list, l_ld: int) -> int | None:
    """Load bias from a PT_LOAD header and the mapping of the same file offset, choosing the
    mapping that puts PT_DYNAMIC where the dynamic linker says it is."""
    dyn = _headers(elf, "PT_DYNAMIC")
    for ph in _loads(elf):
        for m in maps:
            if m.offset != ph.p_offset & ~(PAGE - 1):
                continue
            bias = m.start - (ph.p_vaddr & ~(PAGE - 1))
            if not dyn or bias + dyn[0].p_vaddr == l_ld:
                return bias
    return None


def dynamic_entries(mem: Memory, addr: int) -> dict[int, int]:
    """A dynamic section in memory, tag -> value (the first of each tag; DT_NEEDED's presence,
    not its count). Values as the file has them: d_ptr entries the loader did not adjust are
    relative to the object's l_addr."""
    out: dict[int, int] = {}
    for _ in range(512):
        tag, val = mem.u64(addr), mem.u64(addr + 8)
        if tag == DT_NULL:
            break
        out.setdefault(tag, val)
        addr += 16
    return out


def link_map_at(mem: Memory, r_debug: int) -> list[tuple[int, int, int]]:
    """(l_addr, l_ld, l_name address) of every object in r_debug's list, in its order."""
    out = []
    lm = mem.u64(r_debug + 8)
    while lm and len(out) < 4096:
        l_addr, l_name, l_ld, l_next = (mem.u64(lm + o) for o in (0, 8, 16, 24))
        out.append((l_addr, l_ld, l_name))
        lm = l_next
    return out


def _link_map(mem: Memory, exe_dynamic: int) -> list[tuple[int, int, str]]:
    """(l_addr, l_ld, l_name) for every object, in the dynamic linker's order."""
    r_debug = dynamic_entries(mem, exe_dynamic).get(DT_DEBUG, 0)
    if not r_debug:
        raise TargetError("the target's dynamic linker has not published its link map "
                          "(is it still starting up?)")
    return [(l_addr, l_ld, mem.cstring(l_name) if l_name else "")
            for l_addr, l_ld, l_name in link_map_at(mem, r_debug)]


def _map_files_path(pid: int, m: Mapping) -> str:
    return f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"


def _scan_object(obj: LoadedObject, elf, wanted: dict) -> None:
    """Fill obj.slots, obj.plt and obj.defined from one ELF file."""
    cpu = arch.of(elf["e_machine"], elf.elfclass)
    if cpu is None:
        return  # (not the target's kind: nothing the scan could patch)
    sections = [elf._get_section_header(i) for i in range(elf.num_sections())]
    for h in sections:
        if h["sh_size"] and elf._get_section_name(h) in (".plt", ".plt.sec"):
            lo = obj.bias + h["sh_addr"]
            obj.plt.append((lo, lo + h["sh_size"]))
    dynsym = elf.get_section_by_name(".dynsym")
    if dynsym is None:
        obj.skip = "no dynamic symbol table"
        return
    # The symbol table as arrays: a pyelftools object per symbol costs 0.14 s on libstdc++,
    # the arrays 0.01 ms (docs/benchmarks.md, "The scan").
    syms = np.frombuffer(dynsym.data(), dtype=ELF64_SYM)
    strtab = elf.get_section(dynsym["sh_link"]).data()
    names = [strtab[o:strtab.index(b"\0", o)].decode(errors="replace") for o in syms["name"]]
    versym = elf.get_section_by_name(".gnu.version")
    hidden = (np.frombuffer(versym.data(), "<u2") & 0x8000).astype(bool) if versym is not None \
        and versym["sh_size"] == 2 * len(syms) else np.zeros(len(syms), bool)
    defined = (syms["shndx"] != 0) & ((syms["info"] & 0xF) == STT_FUNC) & (
        ((syms["info"] >> 4) == STB_GLOBAL) | ((syms["info"] >> 4) == STB_WEAK)) & ~hidden
    obj.exported = {names[i] for i in np.flatnonzero(defined) if allocators.candidate(names[i])}
    index_of = {}  # symbol table index -> hook id
    for i, name in enumerate(names):
        hook_id = wanted.get(name)
        if hook_id is None and name not in HELPERS:
            continue
        if hook_id is not None:
            index_of[i] = hook_id
        if defined[i] and name not in obj.defined:
            obj.defined[name] = obj.bias + int(syms["value"][i])
    if not index_of:
        return
    at = next((i for i, h in enumerate(sections) if h["sh_type"] == "SHT_DYNAMIC"), None)
    if at is None:
        return
    # The dynamic table as an array (pyelftools parses each tag as an object).
    table = np.frombuffer(elf.get_section(at).data(), dtype=[("tag", "<i8"), ("val", "<u8")])
    tags = {int(t): int(v) for t, v in zip(table["tag"], table["val"])}
    loads = _loads(elf)
    for start_tag, size_tag in ((DT_RELA, DT_RELASZ), (DT_JMPREL, DT_PLTRELSZ)):
        if start_tag not in tags or not tags.get(size_tag):
            continue
        offset = next((tags[start_tag] - h.p_vaddr + h.p_offset for h in loads
                       if h.p_vaddr <= tags[start_tag] < h.p_vaddr + h.p_filesz), None)
        if offset is None:
            continue
        elf.stream.seek(offset)
        raw = elf.stream.read(tags[size_tag])
        rela = np.frombuffer(raw[:len(raw) // 24 * 24], dtype=[("offset", "<u8"), ("info", "<u8"),
                                                               ("addend", "<i8")])
        types = rela["info"] & 0xFFFFFFFF
        syms = rela["info"] >> 32
        kinds = np.fromiter(cpu.slot_relocations, dtype=np.uint64)
        needs_zero = np.fromiter(cpu.zero_addend, dtype=np.uint64)
        keep = np.isin(syms, np.fromiter(index_of, dtype=np.uint64)) & np.isin(types, kinds) & (
            ~np.isin(types, needs_zero) | (rela["addend"] == 0))
        # The pages glibc makes read-only after relocation (_dl_protect_relro).
        relro = [(obj.bias + (h.p_vaddr & ~(PAGE - 1)),
                  obj.bias + ((h.p_vaddr + h.p_memsz) & ~(PAGE - 1)))
                 for h in _headers(elf)
                 if h.p_type == "PT_GNU_RELRO"]
        for r, t, s in zip(rela[keep], types[keep], syms[keep]):
            hook_id = index_of[int(s)]
            addr = obj.bias + int(r["offset"])
            obj.slots.append(Slot(addr, hook_id, hooks.BY_ID[hook_id].symbol, cpu.slot_relocations[int(t)],
                                  obj.path, any(lo <= addr < hi for lo, hi in relro)))


def scan(pid: int, exe_path: str) -> Layout:
    """Everything memhook needs to patch the target, read while it keeps running."""
    maps = read_maps(pid)
    by_inode: dict = {}
    for m in maps:
        if m.inode and m.path.startswith("/"):
            by_inode.setdefault((m.path, m.inode), []).append(m)
    exe_maps = next((ms for (p, _), ms in by_inode.items() if p == exe_path), None)
    if not exe_maps:
        raise TargetError(f"cannot find the executable {exe_path} in the target's mappings")
    try:
        f, exe = _open_elf(_map_files_path(pid, exe_maps[0]))
    except (OSError, ELFError) as e:
        raise TargetError(f"cannot read the target's executable: {e}") from None
    with f:
        if arch.of(exe["e_machine"], exe.elfclass) is None:
            raise TargetError(f"unsupported target architecture {exe['e_machine']} "
                              f"({exe.elfclass}-bit): this memhook is built for "
                              f"{arch.HOST.name} programs only")
        interp = next((s.get_interp_name() for s in _segments(exe, "PT_INTERP")
                       if s.header.p_type == "PT_INTERP"), None)
        dyn = _headers(exe, "PT_DYNAMIC")
        if not interp or not dyn:
            emulator = re.fullmatch(r"qemu-(\w+?)(-static)?", os.path.basename(exe_path))
            if emulator:  # qemu-user: the program it runs is another processor's
                raise TargetError(f"the target runs an {emulator.group(1)} program under "
                                  f"qemu-user emulation ({os.path.basename(exe_path)}): memhook "
                                  f"is built for {arch.HOST.name} programs only")
            raise TargetError("the target is statically linked: it has no GOT to patch")
        kind = "musl" if "ld-musl" in os.path.basename(interp) else "glibc"
        exe_bias = None
        for ph in _loads(exe):
            m = next((m for m in exe_maps if m.offset == ph.p_offset & ~(PAGE - 1)), None)
            if m is not None:
                exe_bias = m.start - (ph.p_vaddr & ~(PAGE - 1))
                break
        if exe_bias is None:
            raise TargetError("cannot compute the executable's load address")
        exe_dynamic = exe_bias + dyn[0].p_vaddr
        embedded = _function_value(exe, EMBEDDED_SUPPRESSIONS)
        embedded = exe_bias + embedded if embedded else 0

    wanted = {h.symbol: h.id for h in hooks.HOOKS}
    objects = []
    with Memory(pid) as mem:
        chain = _link_map(mem, exe_dynamic)
    for l_addr, l_ld, l_name in chain:
        home = next((m for m in maps if m.start <= l_ld < m.end), None)
        if home is None or not home.inode:
            continue  # the vdso, or an object whose mappings are gone
        group = by_inode.get((home.path, home.inode), [home])
        obj = LoadedObject(home.path, _map_files_path(pid, group[0]), l_addr,
                           min(m.start for m in group), max(m.end for m in group))
        objects.append(obj)
        if os.path.basename(home.path.replace(" (deleted)", "")) == HOOK_LIBRARY_NAME:
            obj.skip = "memhook's own library"
            continue
        try:
            f, elf = _open_elf(obj.file)
        except (OSError, ELFError) as e:
            obj.skip = f"unreadable: {e}"
            continue
        with f:
            bias = _bias_from_maps(elf, group, l_ld)
            if bias is None or bias != l_addr:
                obj.skip = "load address in /proc/PID/maps disagrees with the link map"
                continue
            obj.build_id = build_id(elf)
            _scan_object(obj, elf, wanted)
            if not OWN_ALLOCATOR.search(os.path.basename(home.path)):
                obj.allocators = allocators.find(home.path, elf, obj.exported,
                                                 executable=home.path == exe_path)
        loader = (os.path.basename(l_name) == os.path.basename(interp)
                  or os.path.basename(home.path) == os.path.basename(os.path.realpath(interp)))
        if loader and kind == "musl":
            obj.libc = True  # musl's loader is its libc, whose own calls to malloc use slots
            # ...whose own RELRO is left writable where musl's page size is a run-time value
            # (AArch64: the loader computes the range before it knows the size), and its malloc
            # is given the rest of that page: its slots are written as the maps say the pages
            # are (made read-only, the page faulted musl's next store there). Other objects
            # keep the RELRO rule: one still being loaded is not protected yet in the maps.
            for slot in obj.slots:
                page = next((m for m in group if m.start <= slot.addr < m.end), None)
                slot.readonly = page is None or "w" not in page.perms
        elif loader:
            obj.skip = "the dynamic loader"
        else:
            obj.libc = kind == "glibc" and is_libc(home.path)

    real: dict = {}
    for h in hooks.HOOKS:
        for obj in objects:  # the dynamic linker's search order
            if obj.skip == "memhook's own library":
                continue
            if h.symbol in obj.defined:
                real[h.id] = obj.defined[h.symbol]
                break
    libc = next((o for o in objects if o.libc), None)
    if libc is None:
        raise TargetError(f"cannot find the target's libc among its libraries (loader {interp})")
    version = libc_version(kind, libc.file)
    if baseline_problem(kind, version):
        raise TargetError(baseline_problem(kind, version))
    dlopen, mode = real.get(hooks.BY_SYMBOL["dlopen"].id, 0), 0
    if not dlopen and kind == "glibc":
        # glibc < 2.34 without libdl loaded: its private loader entry point.
        dlopen, mode = libc.defined.get("__libc_dlopen_mode", 0), 0x80000000
    if not dlopen:
        raise TargetError(f"cannot find dlopen in the target's {kind} {version} ({libc.path})")
    owns = [o for o in objects if o.skip == "memhook's own library"]
    return Layout(objects, real, dlopen, mode, libc.defined.get("dlerror", 0),
                  libc.defined.get("munmap", 0), owns[0].bias if owns else 0,
                  owns[0].file if owns else "", kind, version, embedded,
                  [(o.bias, o.file) for o in owns])


EMBEDDED_SUPPRESSIONS = "__lsan_default_suppressions"


def named_symbols(elf, table: str, names, parts: str = "") -> list[tuple[str, int, int, int]]:
    """(name, st_value, st_size, st_info) of the symbols of `table` (".dynsym" or ".symtab")
    that define one of `names`, and, with `parts` (e.g. ".cold"), those named NAME + parts +
    anything. Found in the string table first (a search of bytes per name) and then in the
    table as an array: pyelftools' object per symbol costs seconds on a large program."""
    section = elf.get_section_by_name(table)
    if section is None or section["sh_entsize"] != ELF64_SYM.itemsize:
        return []
    strings = elf.get_section(section["sh_link"]).data()
    at: dict[int, str] = {}  # string offset -> name (linkers share one string's tail)
    for name in names:
        for ending in ((b"\0", parts.encode()) if parts else (b"\0",)):
            key = name.encode() + ending
            k = strings.find(key)
            while k >= 0:
                at[k] = strings[k:strings.index(b"\0", k)].decode(errors="replace")
                k = strings.find(key, k + 1)
    if not at:
        return []
    syms = np.frombuffer(section.data(), dtype=ELF64_SYM)
    keep = np.isin(syms["name"], np.fromiter(at, dtype=np.uint32)) & (syms["shndx"] != 0)
    return [(at[int(s["name"])], int(s["value"]), int(s["size"]), int(s["info"]))
            for s in syms[keep]]


def _function_value(elf, name: str) -> int:
    """A function the file defines, by .dynsym or .symtab (an executable exports nothing unless
    linked with -rdynamic): its st_value, or 0."""
    for table in (".dynsym", ".symtab"):
        for _, value, _, info in named_symbols(elf, table, [name]):
            if info & 0xF == STT_FUNC:
                return value
    return 0


def exported_offsets(path: str) -> dict[str, int]:
    """Offsets of memhook's hook functions and control symbols in its library (read once per
    file as it is: a session asks at its start, attach and detach)."""
    st = os.stat(path)
    return dict(_exported_offsets(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _exported_offsets(path: str, *identity) -> dict[str, int]:
    f, elf = _open_elf(path)
    with f:
        dynsym = elf.get_section_by_name(".dynsym")
        syms = np.frombuffer(dynsym.data(), dtype=ELF64_SYM)
        strings = elf.get_section(dynsym["sh_link"]).data()
        out = {}
        for s in syms[syms["shndx"] != 0]:
            o = int(s["name"])
            if strings.startswith(b"memhook_", o):
                out[strings[o:strings.index(b"\0", o)].decode()] = int(s["value"])
        return out


def defined_symbols(path: str, names: set) -> dict[str, int]:
    """Offsets of the named symbols a file's .dynsym defines (the dynamic loader's, for one)."""
    f, elf = _open_elf(path)
    with f:
        return {n: value for n, value, _, _ in named_symbols(elf, ".dynsym", names)}


def file_build_id(path: str) -> str:
    f, elf = _open_elf(path)
    with f:
        return build_id(elf)


@dataclass
class Module:
    path: str
    build_id: str
    bias: int
    lo: int
    hi: int
    size: int = 0    # of the mapped file
    mtime: int = 0
    file: str = field(default="", compare=False)  # where memhook reads it (not kept in captures)


def modules(pid: int, known: dict | None = None) -> dict:
    """Every ELF object mapped in the target, keyed by (lo, path); `known` entries are reused."""
    known = dict(known or {})
    groups: dict = {}
    maps = read_maps(pid)
    for m in maps:
        if m.inode and m.path.startswith("/"):
            groups.setdefault((m.path, m.inode), []).append(m)
    for (path, _), group in groups.items():
        # One file mapped more than once (dlmopen) forms runs that each start at offset 0.
        runs, cur = [], []
        for m in sorted(group, key=lambda m: m.start):
            if m.offset == 0 and cur:
                runs.append(cur)
                cur = []
            cur.append(m)
        runs.append(cur)
        for run in runs:
            key = (run[0].start, path)
            if key in known or run[0].offset != 0:
                continue
            try:
                f, elf = _open_elf(_map_files_path(pid, run[0]))
            except (OSError, ELFError):
                continue  # not ELF (locale archive, fonts...)
            with f:
                loads = _loads(elf)
                if not loads:
                    continue
                bias = run[0].start - (loads[0].p_vaddr & ~(PAGE - 1))
                st = os.fstat(f.fileno())
                known[key] = Module(path, build_id(elf), bias, run[0].start, run[-1].end,
                                    st.st_size, int(st.st_mtime), _map_files_path(pid, run[0]))
    vdso = next((m for m in maps if m.path == "[vdso]"), None)
    if vdso is not None and (vdso.start, vdso.path) not in known:
        image = vdso_module(pid, vdso)
        if image is not None:
            known[(vdso.start, vdso.path)] = image
    return known


@functools.lru_cache(maxsize=1)
def _own_vdso() -> bytes | None:
    """The vDSO image of memhook's own process: the kernel's, as it gives every process."""
    own = next((m for m in read_maps(os.getpid()) if m.path == "[vdso]"), None)
    return ctypes.string_at(own.start, own.end - own.start) if own else None


def vdso_module(pid: int, m) -> Module | None:
    """The kernel's vDSO as a module: on AArch64 its __kernel_rt_sigreturn is the frame below
    every signal handler, as libc's __restore_rt is on x86-64. It is no file: its image is read
    from the target and kept by build-id (module_files.keep_image), where the unwind tables and
    the reports read it. Only the kernel's own is kept: the image must be byte for byte the one
    memhook's process maps (a target may have written over its copy, and the store is shared by
    every target's reports). None if it cannot be read or kept, or is not the kernel's."""
    try:
        with Memory(pid) as mem:
            data = mem.read(m.start, m.end - m.start)
        if data != _own_vdso():
            return None
        elf = ELFFile(io.BytesIO(data))
        loads = _loads(elf)
        bid = build_id(elf)
        if not loads or not bid:
            return None
        path = module_files.keep_image(bid, data)
    except (OSError, ELFError, ValueError):
        return None
    return Module(m.path, bid, m.start - (loads[0].p_vaddr & ~(PAGE - 1)), m.start, m.end,
                  len(data), 0, path)
