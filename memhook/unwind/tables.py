"""Unwind tables: each loaded object's call-frame information reduced to rows the hooks follow
through code built without frame pointers (hook_cpp/common/unwind_rows.h).

Built here, before GDB stops the target (libdw evaluates the CFI: hook_cpp/unwind/cfi_rows.cpp),
cached on disk by build-id in an owner-only directory, and carried into the target in the
shared segment's unwind area; a library the target loads later gets its rows as soon as the
dlopen hook counts it (Session.poll_loads).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from ..common import arch, disk_cache
from . import prologue_rows

CACHE_VERSION = 8  # 3: main's rows marked kRowLast, its span in the header; 4: kRowNone;
# 5: rows from an .eh_frame without its search table, and the count of exported functions;
# 6: rows derived from the prologues of functions without CFI (prologue_rows.py); 7: rows for
# signal trampolines without CFI (with_signal_trampolines); 8: derived on AArch64 too, and
# "signal_rows" said
CACHE_BOUND = 256 << 20  # bytes of rows kept on disk, the least recently used dropped first
HEADROOM_BYTES = 16 << 20  # room for libraries loaded after attach (sparse until written)
INDEX_ENTRY_BYTES = 32     # sizeof(UnwindObject)


def cache_dir() -> str | None:
    """~/.cache/memhook/unwind, owner-only (disk_cache.py)."""
    return disk_cache.cache_dir("unwind")


@dataclass
class ObjectRows:
    path: str
    rows: bytes
    info: dict
    from_cache: bool = False


def _read_cached(directory: str, key: str) -> ObjectRows | None:
    data = disk_cache.read(directory, key)
    if data is None:
        return None
    head, _, rows = data.partition(b"\n")
    try:
        info = json.loads(head)
    except ValueError:
        return None
    if info.get("version") != CACHE_VERSION or len(rows) != info.get("bytes"):
        return None
    return ObjectRows("", rows, info, True)


def _write_cached(directory: str, key: str, rows: bytes, info: dict) -> None:
    head = json.dumps({**info, "version": CACHE_VERSION, "bytes": len(rows)}).encode() + b"\n"
    disk_cache.write(directory, key, head + rows, CACHE_BOUND)


def cache_key(file: str, build_id: str) -> str:
    """An object's name in the cache: its build-id; for a file without one (numpy's bundled
    OpenBLAS, 25 MB of rows to build, 0.8 s of memhook's time in every session of a numpy
    program), the file as it is now: its real path, inode, size and modification time."""
    if build_id and all(c in "0123456789abcdef" for c in build_id):
        return f"{build_id}.rows"
    now = disk_cache.file_signature(file)
    if now is None:
        return ""
    what = json.dumps([os.path.realpath(file), *now])
    return f"file-{hashlib.sha256(what.encode()).hexdigest()[:32]}.rows"


def rows_for(file: str, build_id: str, directory: str | None) -> ObjectRows:
    """One object's rows: from the cache when they are there, else built (and cached)."""
    key = cache_key(file, build_id)
    if key and directory:
        cached = _read_cached(directory, key)
        if cached is not None:
            cached.path = file
            return cached
    rows, info = _native.cfi_rows(file)
    before = len(rows)
    rows = with_signal_trampolines(file, rows)
    if len(rows) > before:
        info = {**info, "signal_rows": True}
    rows, derived = with_derived_rows(file, rows)
    if derived:
        info = {**info, "derived": len(derived), "derived_ranges": derived}
    if key and directory:
        _write_cached(directory, key, rows, info)
    return ObjectRows(file, rows, info)


def with_signal_trampolines(file: str, rows: bytes) -> bytes:
    """`rows` with a signal row over each signal trampoline no call-frame information covers
    (arch.Arch.sigreturn_code, found in the object's executable code): AArch64's vDSO has no
    .eh_frame, and its __kernel_rt_sigreturn is where every handler returns to; musl's
    __restore_rt has none either. As gdb's sigtramp sniffers read the code, so does this. The
    row starts a byte early: a return address is looked up less one."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    code = arch.HOST.sigreturn_code
    table = np.frombuffer(rows, dtype=prologue_rows.ROW)
    if np.any(table["rule"] & 7 == _native.ROW_SIGNAL):
        return rows
    found = []
    try:
        with open(file, "rb") as f:
            for seg in ELFFile(f).iter_segments():
                h = seg.header
                if h.p_type != "PT_LOAD" or not h.p_flags & 1:  # (PF_X)
                    continue
                data = seg.data()
                at = data.find(code)
                while at >= 0:
                    if (h.p_vaddr + at) % arch.HOST.insn_align == 0:
                        found.append(h.p_vaddr + at)
                    at = data.find(code, at + 1)
    except (OSError, ELFError, ValueError):
        return rows
    starts, kinds = table["start"], table["rule"] & 7
    more = []
    for v in found:
        lo, hi = v - 1, v + len(code)
        i = int(np.searchsorted(starts, lo, side="right")) - 1
        j = int(np.searchsorted(starts, hi, side="left"))
        if (i >= 0 and kinds[i] != prologue_rows.KIND_NONE) or j > i + 1 or hi >= 1 << 32:
            continue  # (covered by rows, or by a row that starts inside it)
        more += [(lo, _native.ROW_SIGNAL), (hi, prologue_rows.rule(prologue_rows.KIND_NONE))]
    return prologue_rows.merge(table, more) if more else rows


def with_derived_rows(file: str, rows: bytes) -> tuple[bytes, list]:
    """`rows` and rows for the functions they leave without, derived from their prologues
    (prologue_rows.py); [(start, end)] of those functions (link-time addresses)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    try:
        with open(file, "rb") as f:
            elf = ELFFile(f)
            loads = [s.header for s in elf.iter_segments() if s.header.p_type == "PT_LOAD"]

            def read(vaddr: int, n: int) -> bytes:
                h = next(h for h in loads if h.p_vaddr <= vaddr < h.p_vaddr + h.p_filesz)
                f.seek(h.p_offset + vaddr - h.p_vaddr)
                return f.read(min(n, h.p_vaddr + h.p_filesz - vaddr))
            return prologue_rows.fill(rows, elf, read)
    except (OSError, ELFError, StopIteration, ValueError):
        return rows, []


def row_span(rows: bytes) -> tuple[int, int]:
    """The link-time addresses an object's rows cover: its first row's start to its last's."""
    first = int.from_bytes(rows[0:4], "little")
    last = int.from_bytes(rows[len(rows) - _native.ROW_BYTES:][:4], "little")
    return first, last


@dataclass
class UnwindTables:
    """The rows of every object memhook has seen in the target, and which are in its segment."""
    objects: dict = field(default_factory=dict)   # module key -> (Module, ObjectRows)
    written: dict = field(default_factory=dict)   # module key -> (first, nrows) in the area
    build_s: float = 0.0
    cached: int = 0
    built: int = 0

    def add(self, modules: dict) -> list:
        """Rows for modules not seen before; returns their keys."""
        directory = cache_dir()
        t0 = time.perf_counter()
        new = []
        for key, m in modules.items():
            if key in self.objects or not m.file:
                continue
            r = rows_for(m.file, m.build_id, directory)
            self.objects[key] = (m, r)
            self.cached += r.from_cache
            self.built += not r.from_cache
            new.append(key)
        self.build_s += time.perf_counter() - t0
        return new

    def area_bytes(self) -> int:
        """An unwind area for these rows and their index, with room for libraries loaded later."""
        rows = sum(len(r.rows) for _, r in self.objects.values())
        need = 64 + rows + 4 * INDEX_ENTRY_BYTES * (len(self.objects) + 64) + HEADROOM_BYTES
        # In steps of the headroom: the next attach's segment (one library more, ours) is the
        # same size, so it takes this one's place in the target (lifecycle.h, settle_segment).
        return -(-max(need, rows * 2) // HEADROOM_BYTES) * HEADROOM_BYTES

    def publish(self, consumer, modules: dict) -> None:
        """Write the rows of `modules` not yet in the segment, then publish all of them that are
        still mapped as the hooks' index."""
        for key in modules:
            if key in self.written or key not in self.objects:
                continue
            rows = self.objects[key][1].rows
            if len(rows) < 2 * _native.ROW_BYTES:
                self.written[key] = None
                continue
            self.written[key] = (consumer.unwind_add_rows(rows), len(rows) // _native.ROW_BYTES)
        index = []
        for key in modules:
            place = self.written.get(key)
            if place is None:
                continue
            m, r = self.objects[key]
            lo, hi = row_span(r.rows)
            index.append((m.bias + lo, m.bias + hi, m.bias, *place))
        consumer.unwind_publish(index)

    def without_rows(self, modules: dict) -> list:
        """(path, why) of mapped objects whose frames the hooks cannot unwind through."""
        out = []
        for key in modules:
            m, r = self.objects.get(key, (None, None))
            # (An object whose CFI memhook cannot read may still have rows for its PLT.)
            if r is None:
                continue
            # (AArch64's vDSO has no CFI at all; of its code only the signal trampoline, which
            # has its row, is ever in a stack: its functions are leaves that call nothing)
            if m.path == "[vdso]" and r.info.get("signal_rows"):
                continue
            if r.info.get("problem") or len(r.rows) < 2 * _native.ROW_BYTES:
                out.append((m.path, r.info.get("problem") or "no call-frame information"))
            elif sparse(r.info) and not r.info.get("derived"):
                out.append((m.path, f"rows for only {r.info['fdes']} of its "
                                    f"{r.info['functions']} exported functions (built without "
                                    "unwind tables, as musl's libc is)"))
        return out


def derived(objects: dict, modules: dict) -> list:
    """[path, functions, [[start, end], ...]] of mapped objects with rows derived from machine
    code (prologue_rows.py): link-time addresses of the functions whose rows were."""
    out = []
    for key in modules:
        m, r = objects.get(key, (None, None))
        if r is not None and r.info.get("derived") and \
                not os.path.basename(m.path).startswith("libmemhook_hook"):  # (its stub)
            out.append([m.path, r.info["derived"], r.info.get("derived_ranges", [])])
    return out


def sparse(info: dict) -> bool:
    """Call-frame information for a small part of an object's functions: stacks through the
    rest end there unless they keep frame pointers (musl's libc.so: 4 FDEs, 1,500 functions)."""
    return info.get("functions", 0) >= 100 and info.get("fdes", 0) * 10 < info["functions"]
