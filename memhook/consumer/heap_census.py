"""The heap before attach: a census of glibc malloc's heap, taken from outside the running
process (issue 33, points 1-3). The walk itself is native (hook_cpp/census/); this module gives
it what /proc says (libc's writable data where main_arena is, the [heap], anonymous mappings
that may be mmapped chunks, file mappings where vtables are, where __cxxabiv1's type_info
vtables are) and turns its result into the words a report uses: live blocks by size class and
by C++ type (demangled, with the module that owns the vtable), free space per arena,
fragmentation, what malloc_trim(0) would return, and the blocks that pin each heap's top.
"""
from __future__ import annotations

import os
import time
from functools import lru_cache

import numpy as np
from elftools.common.exceptions import ELFError

from .. import _native, symbolize
from ..common import procfs
from ..elf import slots as elf
from ..elf.allocators import ELF64_SYM

# A type_info's word 0 is the vtable of one of these, plus 16 (Itanium C++ ABI 2.9.4).
TYPE_INFO_CLASSES = ("_ZTVN10__cxxabiv117__class_type_infoE",
                     "_ZTVN10__cxxabiv120__si_class_type_infoE",
                     "_ZTVN10__cxxabiv121__vmi_class_type_infoE")
# Where those are defined: the C++ runtime, or an executable that links it in and exports them.
CXX_RUNTIMES = ("libstdc++", "libc++abi", "libc++.")


def _glibc_minor(version: str) -> int | None:
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return None
    return minor if major == 2 else None


def _type_info_vtables(pid: int, modules: dict, exe: str) -> list[int]:
    out = []
    for mod in modules.values():
        base = os.path.basename(mod.path)
        if base.startswith(CXX_RUNTIMES) or mod.path == exe:
            out += [mod.bias + value + 16 for value in
                    _defined(mod.file or f"/proc/{pid}/root{mod.path}", mod.build_id)]
    return out


@lru_cache(maxsize=256)
def _defined(path: str, build_id: str) -> tuple:
    """Link-time addresses of the type_info classes' vtables a file's dynamic symbol table
    defines (read as arrays: pyelftools' symbol objects took 2.4 s for libstdc++)."""
    try:
        f, e = elf._open_elf(path)
    except (OSError, ELFError):
        return ()
    with f:
        dynsym = e.get_section_by_name(".dynsym")
        if dynsym is None or dynsym["sh_entsize"] != ELF64_SYM.itemsize:
            return ()
        strtab = e.get_section(dynsym["sh_link"]).data()
        syms = np.frombuffer(dynsym.data(), dtype=ELF64_SYM)
    wanted = set()
    for name in TYPE_INFO_CLASSES:
        at = strtab.find(b"\0" + name.encode() + b"\0")
        if at >= 0:
            wanted.add(at + 1)
    keep = np.isin(syms["name"], list(wanted)) & (syms["shndx"] != 0) if wanted else []
    return tuple(int(v) for v in syms["value"][keep]) if wanted else ()


def take(pid: int, libc: str, libc_version: str, keep_blocks: bool = False,
         modules: dict | None = None) -> tuple:
    """The census as the capture keeps it (or {"problem": why there is none}), and with
    `keep_blocks` its live blocks (_native.CensusBlocks) for Consumer.match_census, else None.
    `modules`: elf.modules() as the caller has them (reused where still mapped)."""
    if libc != "glibc":
        return {"problem": f"the heap census reads glibc's malloc; this target's libc is "
                           f"{libc}"}, None
    minor = _glibc_minor(libc_version)
    if minor is None:
        return {"problem": f"glibc version {libc_version or 'unknown'}: no heap census"}, None
    started = time.monotonic()
    maps = procfs.read_maps(pid)
    modules = elf.modules(pid, modules)
    paths = sorted({m.path for m in maps if m.path.startswith("/")})
    index = {p: i for i, p in enumerate(paths)}
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    args = dict(
        glibc_minor=minor,
        libc_data=[(m.start, m.end) for m in maps if elf.is_libc(m.path) and m.perms[:2] == "rw"],
        heap=brk_heap(maps),
        anonymous=[(m.start, m.end) for m in maps
                   if not m.path and m.perms[:2] == "rw" and m.perms[3] == "p"],
        files=[(m.start, m.end, index[m.path], "x" in m.perms) for m in maps if m.path in index],
        type_info_vtables=_type_info_vtables(pid, modules, exe), keep_blocks=keep_blocks)
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        pagemap = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        pagemap = -1
    try:
        raw = _native.heap_census(mem, pagemap, **args)
    finally:
        os.close(mem)
        if pagemap >= 0:
            os.close(pagemap)
    return summarize(raw, paths, time.monotonic() - started), raw["blocks"]


def summarize(raw: dict, paths: list[str], seconds: float) -> dict:
    if raw["problem"]:
        return {"problem": raw["problem"]}
    # Type ids (the walk's, 1-based) to demangled names; vtables of one type (one per module
    # that emits it) are one row.
    type_names = {}
    types: dict[str, dict] = {}
    for i, (vtable, mangled, module, count, nbytes) in enumerate(raw["types"], 1):
        mangled = mangled.decode(errors="replace")
        name = type_names[i] = symbolize.cxa_demangle(mangled) or mangled
        if not count:
            continue
        t = types.setdefault(name, {"type": name, "module": paths[module] if module >= 0 else "",
                                    "blocks": 0, "bytes": 0})
        t["blocks"] += count
        t["bytes"] += nbytes
    arenas = []
    frag_heaps = []
    for a in raw["arenas"]:
        heaps = []
        for h in a["heaps"]:
            space = h["live_end"] - h["lo"]
            frag = (space - h["live"][1]) / space if space > 0 and h["live"][0] else 0.0
            if h["live"][0]:
                frag_heaps.append((space, h["live"][1], frag))
            addr, size, type_id = h["last_live"]
            heaps.append({
                "lo": h["lo"], "hi": h["hi"], "chunks": h["chunks"],
                "live_blocks": h["live"][0], "live_bytes": h["live"][1],
                "fragmentation": frag, "resident_bytes": h["resident"],
                "resident_live_bytes": h["resident_live"], "resident_free_bytes": h["resident_free"],
                "top_pinned_by": ({"address": addr, "size": size,
                                   "type": type_names.get(type_id, "")} if addr else None),
                "problem": h["problem"]})
        arenas.append({
            "address": a["address"], "main": a["main"], "system_bytes": a["system_mem"],
            "top_bytes": a["top_bytes"], "top_resident_bytes": a["top_resident"],
            "free": {"bins": _tally(a["bins"]), "fastbins": _tally(a["fastbins"]),
                     "tcache": _tally(a["tcache"]), "top": {"chunks": 1 if a["top_bytes"] else 0,
                                                            "bytes": a["top_bytes"]}},
            "free_bytes": a["bins"][1] + a["fastbins"][1] + a["tcache"][1] + a["top_bytes"],
            "largest_free_chunk": a["largest_free"], "trimmable_bytes": a["trimmable"],
            "uncertain_bytes": a["uncertain"], "problems": list(a["problems"]), "heaps": heaps})
    space = sum(s for s, _, _ in frag_heaps)
    live = sum(b for _, b, _ in frag_heaps)
    by_size = [{"size": s, "blocks": c, "bytes": b} for s, c, b in raw["by_size"]]
    total_blocks = sum(c for _, c, _ in raw["by_size"])
    total_bytes = sum(b for _, _, b in raw["by_size"])
    return {
        "problem": "",
        "arenas": arenas,
        "mmapped": {"blocks": raw["mmapped"][0], "bytes": raw["mmapped"][1],
                    "resident_bytes": raw["mmapped_resident"],
                    "unsearched_bytes": raw["mmapped_unsearched"]},
        "live": {"blocks": total_blocks, "bytes": total_bytes},
        "by_size": by_size,
        "by_type": sorted(types.values(), key=lambda t: -t["bytes"]),
        "untyped": _tally(raw["untyped"], "blocks"),
        "fragmentation": {"mean": sum(f for *_, f in frag_heaps) / len(frag_heaps)
                          if frag_heaps else 0.0,
                          "total": (space - live) / space if space else 0.0},
        "trimmable_bytes": sum(a["trimmable_bytes"] for a in arenas),
        "uncertain_bytes": raw["uncertain"],
        "heap_bytes": raw["heap_bytes"], "bytes_read": raw["bytes_read"],
        "walk_seconds": raw["elapsed_ns"] / 1e9, "seconds": seconds,
        "type_names": [""] + [type_names[i] for i in range(1, len(raw["types"]) + 1)],
    }


def main_arena(pid: int, libc_version: str) -> tuple[int, int] | None:
    """glibc's main_arena in the target: (address, bytes), or None where not found. Its top
    and bins point to chunk headers, 16 bytes before a block, which is inside the block before
    it: the leak check must not take them for the program's pointers."""
    minor = _glibc_minor(libc_version)
    if minor is None:
        return None
    maps = procfs.read_maps(pid)
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        found = _native.glibc_main_arena(
            mem, minor, [(m.start, m.end) for m in maps if elf.is_libc(m.path) and
                         m.perms[:2] == "rw"], brk_heap(maps))
    finally:
        os.close(mem)
    return found if found[0] else None


def brk_heap(maps) -> tuple[int, int]:
    """The [heap] from its start to the brk. A child that grew it after fork() shows it as two
    or more mappings side by side (its part and the parent's are different VMAs): one range."""
    parts = [(m.start, m.end) for m in maps if m.path == "[heap]"]
    if not parts:
        return 0, 0
    lo, hi = parts[0]
    for start, end in parts[1:]:
        if start != hi:
            break
        hi = end
    return lo, hi


def freed_in_session(census: dict, classes: list) -> dict:
    """The census's blocks the session saw freed (Consumer.census_classes: per usable size and
    type id, the blocks at attach and how many were freed), by type and by size: how many of
    each were freed, how many are still held at detach."""
    names = census.get("type_names") or [""]
    by_type: dict[str, dict] = {}
    by_size: dict[int, dict] = {}
    total = {"freed_blocks": 0, "freed_bytes": 0, "held_blocks": 0, "held_bytes": 0}
    for usable, type_id, blocks, freed in classes:
        rows = [by_size.setdefault(usable, {"size": usable, **dict.fromkeys(total, 0)}), total]
        name = names[type_id] if type_id < len(names) else ""
        if name:
            rows.append(by_type.setdefault(name, {"type": name, **dict.fromkeys(total, 0)}))
        for r in rows:
            r["freed_blocks"] += freed
            r["freed_bytes"] += freed * usable
            r["held_blocks"] += blocks - freed
            r["held_bytes"] += (blocks - freed) * usable
    return {**total,
            "by_type": sorted(by_type.values(), key=lambda r: -r["freed_bytes"]),
            "by_size": sorted(by_size.values(), key=lambda r: -r["freed_bytes"])}


def _tally(t, unit: str = "chunks") -> dict:
    return {unit: t[0], "bytes": t[1]}
