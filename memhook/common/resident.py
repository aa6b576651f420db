"""The process's resident memory in parts that sum to what the kernel says (issue 33, point 4):
every mapping of /proc/PID/smaps, read once, goes to exactly one part, so the parts' Rss, Pss,
Private_Dirty and Swap add up to smaps' own totals by construction.

The parts, as *Memory – Part 2* (../shared/reference) names resident memory's kinds: malloc's
main heap ([heap]) and its thread arenas' heaps (anonymous mappings at a 64 MiB boundary, the
alignment glibc gives every arena heap), thread stacks (the mapping holding each thread's stack
pointer, named by the thread), memhook's own (its segment and library), shared memory
(/dev/shm, System V, memfd, any shared mapping), file-backed mappings by module, other
anonymous memory (the program's mmap, and malloc's mmapped chunks until the census tells them
apart), and the kernel's ([vdso], [vvar]). Nothing is left over: a mapping no rule claims is
"anonymous" if it has no path, else "file".
"""
from __future__ import annotations

import mmap
import os
import struct

import numpy as np
from dataclasses import dataclass, field

from . import procfs

FIELDS = ("Rss", "Pss", "Private_Dirty", "Swap")
PAGE = mmap.PAGESIZE  # the kernel's: pagemap has one entry per page
ARENA_HEAP_ALIGN = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: arena heaps start aligned to it
KERNEL = ("[vdso]", "[vvar]", "[vsyscall]", "[vvar_vclock]")


@dataclass
class Region:
    start: int
    end: int
    perms: str
    path: str
    kb: dict = field(default_factory=dict)  # smaps' fields, in bytes


@dataclass
class Part:
    name: str      # "malloc heap", "thread stack: worker-3", "file: libc.so.6", ...
    kind: str      # heap, arena, mmapped, mmap, stack, memhook, shared, file, anonymous, kernel
    regions: int = 0
    bytes: dict = field(default_factory=lambda: {f: 0 for f in FIELDS})
    stack: int = 0  # kind mmap: the call stack that mapped it (the consumer's stack id)


def read_smaps(pid: int) -> list[Region]:
    """Every mapping with its sizes (bytes)."""
    regions: list[Region] = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head, _, rest = line.partition(" ")
            if "-" in head and not head.endswith(":"):
                fields = line.split(None, 5)
                lo, _, hi = fields[0].partition("-")
                regions.append(Region(int(lo, 16), int(hi, 16), fields[1],
                                      fields[5].rstrip("\n") if len(fields) > 5 else ""))
            elif regions and head.endswith(":") and rest.strip().endswith("kB"):
                regions[-1].kb[head[:-1]] = int(rest.split()[0]) * 1024
    return regions


def thread_stack_pointers(pid: int) -> dict[int, str]:
    """Each thread's stack pointer (from /proc/PID/task/TID/syscall, which says it for a thread
    blocked in a system call, and /stat's kstkesp where the kernel gives it) and its name."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/syscall") as f:
                words = f.read().split()
            sp = int(words[-2], 16) if len(words) >= 3 else 0
            if not sp:
                sp = int(procfs.stat_fields(pid, tid)[26])
        except (OSError, ValueError, IndexError):
            continue
        if sp:
            out[sp] = f"{name} ({tid})"
    return out


def arena_heap(pid: int, r: Region) -> bool:
    """Whether an anonymous mapping is one of glibc's thread-arena heaps: at a 64 MiB boundary,
    and starting with a heap_info (ar_ptr, prev, size, mprotect_size) whose size is this
    mapping's and whose arena lies in it or whose previous heap is at another boundary."""
    if r.start % ARENA_HEAP_ALIGN or not r.perms.startswith("rw") or \
            r.end - r.start > ARENA_HEAP_ALIGN:
        return False
    try:
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(r.start)
            ar_ptr, prev, size, mprotect_size = struct.unpack("<4Q", mem.read(32))
    except (OSError, struct.error):
        return False
    return (size == r.end - r.start and mprotect_size >= size
            and (r.start < ar_ptr < r.end or (prev and prev % ARENA_HEAP_ALIGN == 0)))


def thread_stack_size(pid: int) -> int:
    """The size glibc gives a thread's stack by default: the soft RLIMIT_STACK, as
    pthread_create reads it (0 when unlimited or unreadable: then not known)."""
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max stack size"):
                    soft = line[len("Max stack size"):].split()[0]
                    return int(soft) if soft.isdigit() else 0
    except OSError:
        pass
    return 0


def split_merged_stacks(pid: int, regions: list[Region], sps: list[int]) -> list[Region]:
    """A thread's stack the kernel merged with the anonymous mappings above it (Linux before
    6.7 ignores MAP_STACK, so a stack and the program's mmap or malloc's mmapped chunks made
    next to it become one mapping): when a mapping holding a stack pointer is larger than a
    default stack and begins above a guard page with the pointer in that first stack's
    length, it is cut there. The pieces' fields are shared by their pages in memory
    (/proc/PID/pagemap), so every sum stays smaps'."""
    size = thread_stack_size(pid)
    out: list[Region] = []
    for n, r in enumerate(regions):
        cut = r.start + size - PAGE  # (glibc's guard page is the stack block's first page)
        guarded = n and regions[n - 1].end == r.start and regions[n - 1].perms.startswith("---")
        if not size or not guarded or r.path or cut >= r.end or \
                not any(r.start <= sp < cut for sp in sps):
            out.append(r)
            continue
        try:
            with open(f"/proc/{pid}/pagemap", "rb") as f:
                f.seek(r.start // PAGE * 8)
                entries = np.frombuffer(f.read((r.end - r.start) // PAGE * 8), "<u8")
        except OSError:
            out.append(r)
            continue
        present = entries >> 63
        total = int(present.sum())
        first = int(present[:(cut - r.start) // PAGE].sum()) / total if total else 0.0
        low = Region(r.start, cut, r.perms, r.path, {k: round(v * first) for k, v in r.kb.items()})
        out += [low, Region(cut, r.end, r.perms, r.path,
                            {k: v - low.kb[k] for k, v in r.kb.items()})]
    return out


def parts(pid: int, memhook_paths: tuple = ("memhook-", "libmemhook_hook")) -> list[Part]:
    """The parts of the process's memory, largest resident first; their sums are smaps'."""
    stacks = thread_stack_pointers(pid)
    regions = split_merged_stacks(pid, read_smaps(pid), list(stacks))
    out: dict[str, Part] = {}

    def add(name: str, kind: str, r: Region) -> None:
        p = out.setdefault(name, Part(name, kind))
        p.regions += 1
        for f in FIELDS:
            p.bytes[f] += r.kb.get(f, 0)

    for r in regions:
        path = r.path.replace(" (deleted)", "")
        base = os.path.basename(path)
        stack = next((who for sp, who in stacks.items() if r.start <= sp < r.end), None)
        if stack is not None or path == "[stack]":
            add(f"thread stack: {stack or 'main'}", "stack", r)
        elif path == "[heap]":
            add("malloc heap (main arena)", "heap", r)
        elif path in KERNEL:
            add("kernel ([vdso], [vvar])", "kernel", r)
        elif any(m in base for m in memhook_paths):
            add("memhook (its segment and library)", "memhook", r)
        elif path.startswith(("/dev/shm/", "/SYSV", "memfd:")) or r.perms[3:4] == "s":
            add("shared memory", "shared", r)
        elif path.startswith("/"):
            add(f"file: {base}", "file", r)
        elif not path and arena_heap(pid, r):
            add("malloc heaps (thread arenas)", "arena", r)
        else:
            add("anonymous (mmap, malloc's mmapped chunks)", "anonymous", r)
    return sorted(out.values(), key=lambda p: -p.bytes["Rss"])


# The time series' grouping of the kinds (capture/format.py PART_COLUMNS).
KIND_COLUMNS = {"heap": "rss_heap_bytes", "arena": "rss_heap_bytes",
                "mmapped": "rss_anonymous_bytes", "mmap": "rss_anonymous_bytes",
                "anonymous": "rss_anonymous_bytes", "stack": "rss_stack_bytes",
                "file": "rss_file_bytes", "shared": "rss_shared_bytes",
                "memhook": "rss_memhook_bytes", "kernel": "rss_other_bytes"}


def kind_totals(pid: int) -> dict:
    """The resident bytes of each group of kinds (KIND_COLUMNS), for the time series; {} when
    the process cannot be read."""
    out = dict.fromkeys(KIND_COLUMNS.values(), 0)
    try:
        for p in parts(pid):
            out[KIND_COLUMNS.get(p.kind, "rss_other_bytes")] += p.bytes["Rss"]
    except OSError:
        return {}
    return out


def totals(pid: int) -> dict:
    """smaps_rollup's own sums (bytes), to check the parts against."""
    out = {f: 0 for f in FIELDS}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in out:
                out[key] = int(rest.split()[0]) * 1024
    return out


def split_by_census(found: list[Part], census: dict | None) -> list[Part]:
    """The malloc parts split as the heap census saw their pages (heap_census.py): each heap
    part into its live blocks, its free chunks (bins, tcache, fastbins, top) and the rest
    (headers of arenas and heaps, tcache structs, what the walk could not read); malloc's
    mmapped chunks out of the anonymous part. Each field is shared in proportion to the
    census's resident bytes, the rest to the last share, so every sum stays smaps'."""
    if not census or census.get("problem"):
        return found
    main = [h for a in census["arenas"] if a["main"] for h in a["heaps"]]
    threads = [h for a in census["arenas"] if not a["main"] for h in a["heaps"]]
    def heap_shares(where: str, kind: str, heaps: list) -> list:
        return [(f"{label} ({where})", kind, sum(h[k] for h in heaps) if k else None)
                for label, k in SPLIT]

    shares = {
        "heap": heap_shares("main arena", "heap", main),
        "arena": heap_shares("thread arenas", "arena", threads),
        "anonymous": [("malloc's mmapped chunks", "mmapped",
                       census["mmapped"]["resident_bytes"]),
                      ("anonymous (the program's mmap)", "anonymous", None)],
    }
    return _share(found, shares)


def _share(found: list[Part], shares: dict) -> list[Part]:
    """Each part of a kind in `shares` split into its shares: (name, kind, resident bytes, stack)
    each, the last taking the rest (named as the part, if its name is None). Every field is divided in proportion to the resident bytes,
    so every sum stays what it was."""
    out = []
    for p in found:
        if p.kind not in shares:
            out.append(p)
            continue
        rss, left = p.bytes["Rss"], dict(p.bytes)
        *first, (last_name, last_kind, _, last_stack) = [(*s, 0)[:4] for s in shares[p.kind]]
        for name, kind, resident_bytes, stack in first:
            share = min(resident_bytes, left["Rss"]) / rss if rss else 0.0
            q = Part(name, kind, p.regions, stack=stack)
            for f in FIELDS:
                q.bytes[f] = min(left[f], round(p.bytes[f] * share))
                left[f] -= q.bytes[f]
            out.append(q)
        out.append(Part(last_name or p.name, last_kind, p.regions, left, last_stack))
    return sorted(out, key=lambda p: -p.bytes["Rss"])


def split_by_mappings(found: list[Part], pid: int, ranges: list) -> list[Part]:
    """The program's anonymous mmap split by the call stacks that mapped it in the session
    (the consumer's mappings: [start, end, stack] each): their resident pages read from
    /proc/PID/pagemap; what no traced mapping holds stays one part."""
    if not ranges:
        return found
    per_stack: dict[int, int] = {}
    try:
        with open(f"/proc/{pid}/pagemap", "rb") as f:
            for lo, hi, stack in ranges:
                f.seek(lo // PAGE * 8)
                entries = np.frombuffer(f.read((hi - lo) // PAGE * 8), "<u8")
                present = int(np.count_nonzero(entries >> 63))  # bit 63: in RAM
                per_stack[stack] = per_stack.get(stack, 0) + present * PAGE
    except OSError:
        return found
    rows = [(f"anonymous mmap, stack {stack}", "mmap", nbytes, stack)
            for stack, nbytes in sorted(per_stack.items(), key=lambda kv: -kv[1]) if nbytes]
    return _share(found, {"anonymous": rows + [(None, "anonymous", None)]})


# How a heap part splits: its label, and the census's resident bytes for it (None: the rest).
SPLIT = (("malloc heap: live blocks", "resident_live_bytes"),
         ("malloc heap: free chunks", "resident_free_bytes"),
         ("malloc heap: allocator overhead", None))


def table(pid: int, census: dict | None = None, ranges: list | None = None) -> list[dict]:
    """parts() as the capture keeps them (bytes), split by the heap census and the session's
    mappings when there are, or [] when the process cannot be read."""
    try:
        found = split_by_mappings(split_by_census(parts(pid), census), pid, ranges or [])
    except OSError:
        return []
    return [{"part": p.name, "kind": p.kind, "regions": p.regions,
             **{f.lower() + "_bytes": p.bytes[f] for f in FIELDS},
             **({"stack": p.stack} if p.stack else {})} for p in found]
