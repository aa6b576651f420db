"""The report as text: what `memhook report` and the final report print, and a diff's text."""
from __future__ import annotations

import os

from ..common.format import duration_text, frame_text, human_bytes, one_line
from ..common.format import leak_site as one_line_site
from ..common.short_names import simplify
from ..reachability import categories
from . import suppressions


def process_memory_text(pm: dict, explained: bool = False) -> str:
    """The process's memory beside what this session saw allocated: the rest is not a leak
    finding, it is everything else (`explained`: the resident table and the heap census say
    what it is)."""
    rest = (" (blocks allocated before attach, the allocator's overhead and the free memory it"
            " keeps, memory not from malloc" + ("; the tables below say which)" if explained
                                                  else ")"))
    return (f"resident {human_bytes(pm['rss_bytes'])}, anonymous {human_bytes(pm['anon_bytes'])};"
            f" blocks allocated in this session and still live {human_bytes(pm['live_bytes'])};"
            f" anonymous memory not accounted for by them {human_bytes(max(pm['gap_bytes'], 0))}"
            + rest + (f" — {pm['note']}" if pm.get("note") else ""))


def abandoned_lines(report: dict) -> list[str]:
    """A session the target ended by itself: from then on nothing was traced, and saying
    nothing would pass its later allocations off as none."""
    if not report.get("abandoned"):
        return []
    return ["  tracing stopped before the end: the target unhooked itself when memhook's "
            "heartbeat looked older than --unhook-after to it (memhook starved of CPU, or "
            "stopped); what it did after that was not traced"]


def dropped_frees_lines(t: dict) -> list[str]:
    """What became of the frees the hooks dropped (ring full): none is a leak unsaid; and how
    long threads waited for room instead."""
    lines = []
    if t.get("waited_events"):
        lines.append(f"  waited for room in a full ring: {t['waited_events']} events, "
                     f"{t['wait_ns'] / 1e6:.1f} ms in all, the longest {t['wait_max_us'] / 1e3:.1f} ms"
                     + (f"; {t['wait_timeouts']} waited as long as allowed (--max-wait, or their "
                        f"thread's share) and were dropped"
                        if t.get("wait_timeouts") else ""))
    if t["dropped_events"]:
        lines.append("  (--lossless makes every event wait for room, up to --max-wait, rather "
                     "than be dropped)")
    return lines + _dropped_free_lines(t)


def _dropped_free_lines(t: dict) -> list[str]:
    if not t["dropped_frees"]:
        return []
    if t.get("dropped_frees_unchecked"):
        return [f"  {t['dropped_frees']} of the dropped events were frees, not checked (the "
                "target had exited, or the capture was cut off): up to that many blocks counted "
                "as outstanding may have been freed"]
    line = (f"  {t['dropped_frees']} of the dropped events were frees: the target's address "
            f"table showed {t['reconciled_frees']} outstanding blocks freed (no longer counted)")
    if t.get("uncertain_count"):
        return [line + ";", f"  uncertain: {t['uncertain_count']} outstanding blocks, "
                f"{human_bytes(t['uncertain_bytes'])}, may have been freed (their table entries "
                "were reused): marked per stack"]
    return [line + "; every other outstanding block is live"]


def resident_lines(res: dict | None, shown: int = 12) -> list[str]:
    """The "Resident memory" table: every part of smaps' resident memory, summing to RSS."""
    if not res or not res.get("parts"):
        return []
    parts = res["parts"]
    rss = sum(p["rss_bytes"] for p in parts)
    lines = [f"Resident memory at {res['when']} (smaps: {human_bytes(rss)} resident; the parts "
             "sum to it):",
             f"  {'resident':>10} {'private dirty':>14} {'swap':>10}  part"]
    rest = parts[shown:]
    for p in parts[:shown]:
        lines.append(f"  {human_bytes(p['rss_bytes']):>10} {human_bytes(p['private_dirty_bytes']):>14} "
                     f"{human_bytes(p['swap_bytes']):>10}  {one_line(p['part'])}")
    if rest:
        lines.append(f"  {human_bytes(sum(p['rss_bytes'] for p in rest)):>10} "
                     f"{human_bytes(sum(p['private_dirty_bytes'] for p in rest)):>14} "
                     f"{human_bytes(sum(p['swap_bytes'] for p in rest)):>10}  "
                     f"{len(rest)} more parts")
    return lines


def census_ok(report: dict) -> bool:
    at = (report.get("heap_census") or {}).get("attach") or {}
    return bool(at) and not at.get("problem")


def census_frees_text(report: dict) -> str:
    """How many unknown frees freed blocks the census found before attach."""
    freed = ((report.get("heap_census") or {}).get("attach") or {}).get("freed_in_session")
    return (f" ({freed['freed_blocks']} of them blocks held before attach, as the heap census "
            "found them)") if freed and report["totals"]["unknown_free_count"] else ""


def _module(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def type_name(name: str, full_names: bool = False) -> str:
    """A C++ type on one line: std::string for its alias, default arguments dropped
    (short_names.simplify) unless `full_names`."""
    return one_line(name if full_names else simplify(name))


def census_lines(census: dict | None, shown: int = 8, full_names: bool = False) -> list[str]:
    """"Held before attach" (the census at attach: live blocks by C++ type and by size) and
    malloc's own share (free space per arena, fragmentation, what malloc_trim(0) returns, what
    pins each heap's top); at detach, the C++ types whose count grew."""
    if not census:
        return []
    at = census.get("attach") or {}
    if at.get("problem"):
        return [f"Held before attach: no heap census ({one_line(at['problem'])})"]
    if not at:
        return []
    live = at["live"]
    lines = [f"Held before attach (glibc malloc's heap walked at attach, "
             f"{human_bytes(at['heap_bytes'])} in {duration_text(at['walk_seconds'] * 1e9)}): "
             f"{live['blocks']} live blocks, {human_bytes(live['bytes'])}"]
    freed = at.get("freed_in_session")
    if freed:
        lines.append(f"  freed during the session: {freed['freed_blocks']} of them, "
                     f"{human_bytes(freed['freed_bytes'])}; still held at detach: "
                     f"{freed['held_blocks']}, {human_bytes(freed['held_bytes'])}")
    head = f"  {'blocks':>10} {'bytes':>10}" + (f" {'freed':>10} {'held':>10}" if freed else "")

    def row(blocks: int, nbytes: int, key: str, value, what: str) -> str:
        line = f"  {blocks:>10} {human_bytes(nbytes):>10}"
        if freed:
            f = next((r for r in freed[key] if r[value[0]] == value[1]), None)
            line += (f" {f['freed_blocks']:>10} {f['held_blocks']:>10}" if f
                     else f" {0:>10} {blocks:>10}")
        return line + f"  {what}"

    if at["by_type"]:
        lines.append(head + "  C++ type (its vtable's module)")
        for t in at["by_type"][:shown]:
            lines.append(row(t["blocks"], t["bytes"], "by_type", ("type", t["type"]),
                             f"{type_name(t['type'], full_names)} ({_module(t['module'])})"))
        lines.append(f"  {at['untyped']['blocks']:>10} {human_bytes(at['untyped']['bytes']):>10}"
                     + " " * (22 if freed else 0)
                     + "  without a vtable (C structs, strings, arrays)")
    sizes = sorted(at["by_size"], key=lambda s: -s["bytes"])
    lines.append(head + "  usable size (largest share first)")
    for s in sizes[:shown]:
        lines.append(row(s["blocks"], s["bytes"], "by_size", ("size", s["size"]),
                         f"{s['size']} B"))
    if len(sizes) > shown:
        rest = sizes[shown:]
        lines.append(f"  {sum(s['blocks'] for s in rest):>10} "
                     f"{human_bytes(sum(s['bytes'] for s in rest)):>10}  {len(rest)} more sizes")
    mm = at["mmapped"]
    if mm["blocks"]:
        lines.append(f"  of them mmapped by malloc (above its mmap threshold): {mm['blocks']} "
                     f"blocks, {human_bytes(mm['bytes'])}")
    if mm.get("unsearched_bytes"):
        lines.append(f"  mmapped blocks not searched for in {human_bytes(mm['unsearched_bytes'])} of "
                     "anonymous mappings (memhook looks at 1 GiB of touched pages at most)")
    lines.append("malloc's own share at attach (free: bins + tcache + fastbins + top):")
    lines.append(f"  {'arena':>14} {'system':>10} {'live':>10} {'free':>10} {'bins':>10} "
                 f"{'tcache':>10} {'fastbins':>10} {'top':>10} {'largest':>10}")
    for n, a in enumerate(at["arenas"]):
        f = a["free"]
        live_bytes = sum(h["live_bytes"] for h in a["heaps"])
        lines.append(f"  {'main' if a['main'] else f'thread {n}':>14} "
                     f"{human_bytes(a['system_bytes']):>10} {human_bytes(live_bytes):>10} "
                     f"{human_bytes(a['free_bytes']):>10} {human_bytes(f['bins']['bytes']):>10} "
                     f"{human_bytes(f['tcache']['bytes']):>10} "
                     f"{human_bytes(f['fastbins']['bytes']):>10} {human_bytes(f['top']['bytes']):>10} "
                     f"{human_bytes(a['largest_free_chunk']):>10}")
    frag = at["fragmentation"]
    lines.append(f"  fragmentation (free space below each heap's highest live block over that "
                 f"space): mean {frag['mean']:.1%} per heap, total {frag['total']:.1%}")
    lines.append(f"  malloc_trim(0) would return about {human_bytes(at['trimmable_bytes'])} of "
                 "resident pages (memhook trim -p PID)")
    for n, a in enumerate(at["arenas"]):
        for h in a["heaps"]:
            pin = h.get("top_pinned_by")
            if pin and a["main"]:
                lines.append(f"  the main heap's top is held by a live block of {pin['size']} B" +
                             (f" ({type_name(pin['type'], full_names)})" if pin["type"] else "") +
                             " (its address: JSON heap_census.attach.arenas[0].heaps)")
            if h["problem"]:
                lines.append(f"  not walked: {one_line(h['problem'])}")
        for problem in a["problems"]:
            lines.append(f"  {'main arena' if a['main'] else f'thread arena {n}'}: "
                         f"{one_line(problem)}")
    if at["uncertain_bytes"]:
        lines.append(f"  uncertain: {human_bytes(at['uncertain_bytes'])} of heap could not be "
                     "read consistently (not counted above)")
    end = census.get("detach") or {}
    for a in end.get("arenas", []):
        for h in a["heaps"]:
            pin = h.get("top_pinned_by")
            if pin and pin.get("frames"):
                lines.append(f"  at detach, {'the main heap' if a['main'] else 'a thread heap'}'s "
                             f"top is held by a block of {pin['size']} B allocated in the "
                             f"session" + (f" ({type_name(pin['type'], full_names)})" if pin["type"] else "")
                             + ":")
                lines += [f"      {frame_text(f)}" for f in pin["frames"][:4]]
    grew = census.get("growing_types") or []
    if grew:
        lines.append("C++ types with more live blocks at detach than at attach:")
        for t in grew[:shown]:
            lines.append(f"  {'+' + str(t['grown_blocks']):>10} {t['detach_blocks']:>10} blocks  "
                         f"{type_name(t['type'], full_names)} ({_module(t['module'])})")
    return lines


def allocator_stats_lines(stats: dict | None) -> list[str]:
    """jemalloc's, tcmalloc's or mimalloc's own statistics, at attach and detach."""
    lines = []
    for when in ("attach", "detach"):
        s = (stats or {}).get(when)
        if not s:
            continue
        if s.get("problem"):
            lines.append(f"{s['problem']} ({when})")
            continue
        values = ", ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in s["values"].items())
        lines.append(f"{s['allocator']}'s own statistics at {when} "
                     f"({s['module'].rsplit('/', 1)[-1]}): {values}")
    return lines


def mapping_lines(m: dict | None, shown: int = 5, frames: int = 4,
                  full_names: bool = False) -> list[str]:
    """The program's anonymous mappings in the session, by call stack (mmap hooks)."""
    if not m:
        return []
    lines = [f"Anonymous mmap in this session (mmap, munmap, mremap, madvise): "
             f"{human_bytes(m['outstanding_bytes'])} still mapped of "
             f"{human_bytes(m['mapped_bytes'])} mapped"
             + (f"; {human_bytes(m['unknown_unmapped_bytes'])} unmapped that was mapped before "
                "attach" if m["unknown_unmapped_bytes"] else "") + ":"]
    for r in m["stacks"][:shown]:
        lines.append(f"  {human_bytes(r['outstanding_bytes']):>10} still mapped, "
                     f"{r['maps']} mapping{'s' if r['maps'] != 1 else ''} of "
                     f"{human_bytes(r['mapped_bytes'])}"
                     + (f", {human_bytes(r['released_bytes'])} released (MADV_DONTNEED)"
                        if r["released_bytes"] else "")
                     + f": {one_line_site(r, full_names=full_names)}")
        for f in r["frames"][:frames]:
            lines.append(f"      {frame_text(f)}")
    return lines


def leak_check_lines(check: dict | None, shown: int = 5) -> list[str]:
    """The leak check at detach: valgrind's categories over the session's blocks, or why it was
    not taken; the lost blocks from before attach by size and type, `shown` groups."""
    if not check:
        return []
    if check.get("skipped"):
        return [f"  leak check: skipped: {check['skipped']}"]
    t, before = check["totals"], check["before_attach"]
    lines = [f"  leak check at {check.get('when', 'detach')} (every thread stopped "
             f"{check['pause_ms']:.1f} ms, "
             + (f"the copy it made of itself read in {check['scan_ms']:.0f} ms after, "
                if check.get("forked") else "")
             + f"{human_bytes(check['bytes_read'])} scanned): "
             + "; ".join(f"{categories.WORDS[c]} {t[c + '_bytes']} bytes in "
                         f"{t[c + '_count']} blocks" for c in categories.CATEGORIES)]
    if any(before.values()):
        lines.append("    of the blocks from before attach (stacks unknown): "
                     + (categories.text(before) or "none"))
    lines += before_attach_lost_lines(check.get("before_attach_lost") or [], shown)
    if check.get("note"):
        lines.append(f"    {check['note']}")
    return lines


def before_attach_lost_lines(groups: list, shown: int) -> list[str]:
    """'      definitely lost: 3 blocks of 48 bytes, Foo' per group, the most bytes first."""
    lines = [f"      {categories.WORDS[g['category']]}: {g['blocks']} blocks of {g['size']} "
             f"bytes" + (f", {type_name(g['type'])}" if g["type"] else "")
             for g in groups[:shown]]
    if len(groups) > shown:
        lines.append(f"      ... {len(groups) - shown} more groups "
                     f"({human_bytes(sum(g['bytes'] for g in groups[shown:]))}; the JSON "
                     "report has them all)")
    return lines


def python_lines(python: dict | None) -> list:
    """The interpreter memhook found, and whether its frames are in the stacks."""
    if not python:
        return []
    version = f"CPython {python.get('version') or '(version unknown)'}"
    if not python.get("frames"):
        lines = [f"  Python frames not read: {one_line(str(python.get('why', '')), limit=300)}"]
    else:
        line = f"  {version}: Python frames read ({python.get('code_objects', 0)} code objects named"
        if python.get("unrecorded"):
            line += f"; {python['unrecorded']} code objects unnamed: the code area was full"
        lines = [line + ")"]
    if python.get("allocators") is False or python.get("allocators_why"):
        lines.append("  " + one_line(python.get("allocators_why") or "CPython's allocator was "
                                     "not hooked: Python objects are seen as pymalloc's arenas "
                                     "only", limit=300))
    return lines


HOW_TO_MAP = {"jvm": "`jcmd PID Compiler.perfmap` writes one (before memhook detaches; or "
                     "start the JVM with -XX:+DumpPerfMapAtExit)",
              "node": "start node with --perf-basic-prof (and --interpreted-frames-native-stack "
                      "for functions not yet compiled)"}


def jit_lines(jit: dict | None) -> list:
    """A JIT runtime: what its perf map named, or how to get one."""
    if not jit:
        return []
    if jit.get("entries"):
        return [f"  JIT-compiled frames named from {jit.get('perf_map') or 'the perf map'} "
                f"({jit['entries']} entries" + ("; read up to its size limit" if jit.get("cut")
                                                else "") + ")"]
    how = HOW_TO_MAP.get(jit.get("runtime") or "")
    return [f"  JIT-compiled frames unnamed: the runtime wrote no perf map"
            + (f"; {how}" if how else "")]


def render_text(report: dict, top: int = 10, frames: int = 8, full_names: bool = False) -> str:
    """The text report. One-line names (a stack's header, the suspects) are short
    (short_names.py) unless `full_names`; the stacks' frame listings are always full."""
    t = report["totals"]

    def leak_site(r):
        return one_line_site(r, full_names=full_names)

    procs = report.get("processes")
    who = (f"{len(procs)} processes" if procs
           else f"PID {report['pid']} ({one_line(str(report['command']))})")
    lines = [
        f"memhook report: {who}, "
        + (f"{one_line(report['libc'])}, " if report.get("libc") and not procs else "")
        + f"{report['duration_s']} s traced"
        + (f" [at {report['end_reason']}]" if report.get("end_reason", "").startswith(
            "snapshot ") else "")
        + (" [capture cut off]" if report.get("incomplete") else ""),
        f"  allocated {t['alloc_count']} blocks, {human_bytes(t['alloc_bytes'])}; "
        f"freed {t['free_count']} blocks, {human_bytes(t['free_bytes'])}",
        f"  outstanding {t['outstanding_count']} blocks, {t['outstanding_bytes']} bytes "
        f"({human_bytes(t['outstanding_bytes'])})",
        f"  unknown frees (allocated before attach or filtered): {t['unknown_free_count']}"
        + census_frees_text(report) + "; "
        f"dropped events: {t['dropped_events']}",
    ]
    lines += abandoned_lines(report) + dropped_frees_lines(t) + \
        python_lines(report.get("python")) + jit_lines(report.get("jit"))
    if t.get("sample_rate"):
        lines.append(f"  sampled: one allocation per {human_bytes(t['sample_rate'])} on average "
                     f"({t['sampled_allocations']} samples); counts and bytes are estimates")
    pm = report.get("process_memory")
    if pm:
        lines.append("  process: " + process_memory_text(
            pm, explained=bool(report.get("resident_memory") and census_ok(report))))
    lines += leak_check_lines(report.get("leak_check"))
    lines += resident_lines(report.get("resident_memory"))
    lines += census_lines(report.get("heap_census"), full_names=full_names)
    lines += allocator_stats_lines(report.get("allocator_stats"))
    lines += mapping_lines(report.get("mappings"), full_names=full_names)
    for m in report.get("unsymbolized_modules", []):
        lines.append(f"  not symbolized: {m['module']}: {m['reason']}")
    for a in report.get("allocators", []):
        if a.get("traced") != "yes":
            lines.append(f"  {one_line(str(a.get('note', '')), limit=400)}")
    for m in report.get("modules_with_derived_rows", []):
        lines.append(f"  {os.path.basename(m['module'])}: {m['functions']} functions without "
                     "call-frame information, unwound by rows derived from their machine code "
                     "(their frames are marked [derived rows])")
    for m in report.get("modules_without_unwind_rows", []):
        lines.append(f"  no unwind rows: {m['module']}: {m['reason']} (its frames are walked by "
                     "frame pointer; where it has none, stacks end there: [no unwind info])")
    if procs:
        lines.append("Processes (growing first):")
        for r in procs:
            first = r.get("top_suspect")
            where = leak_site(first) if first else ""
            libc = f", {one_line(r['libc'])}" if r.get("libc") else ""
            lines.append(f"  PID {r['pid']} ({one_line(str(r['command']))}{libc}): outstanding "
                         f"{human_bytes(r['outstanding_bytes'])} in {r['outstanding_count']} "
                         f"blocks; " + (f"growing {human_bytes(r['growth_bytes_per_min'])}/min"
                                        f", first at {where}" if r["growing"]
                                        else "not growing")
                         + (f" [{r['end_reason']}]" if r.get("end_reason") not in
                            (None, "", "interrupted", "duration reached", "terminated") else ""))
        lines.append("Merged view (stacks matched by build-id and offset across processes):")
    if report.get("leak_suspects"):
        lines.append("Leak suspects (" + ("blocks no pointer reaches first, then by growth at "
                                          "the end of the capture):"
                                          if report.get("leak_check", {}).get("totals") else
                                          "growth at the end of the capture first):"))
        for n, r in enumerate(report["leak_suspects"][:top], 1):
            where = leak_site(r)
            lines.append(f"  {n}. " + (f"PID {r['pid']}: " if "pid" in r else "")
                         + f"{where}: {r['outstanding_bytes']} bytes; " + "; ".join(r["reasons"]))
    for r in report.get("not_suspects", []):
        lines.append(f"  not a suspect, though it holds {r['outstanding_bytes']} bytes: "
                     f"{leak_site(r)}: {r['why']}")
    hidden = report.get("suppressed_suspects")
    if hidden:
        lines.append(f"  ({hidden['count']} suspects suppressed, {hidden['outstanding_bytes']} "
                     "bytes: --no-suppressions lists them)")
    for r in report.get("transient", [])[:3]:
        where = leak_site(r)
        lines.append(f"  transient: {where}: {r['transient_count']} of {r['alloc_count']} "
                     f"freed within {duration_text(report['transient_threshold_ns'])}"
                     + (f" ({r['unclassified_count']} more freed too quietly to time that "
                        "finely)" if r.get("unclassified_count") else "")
                     + f"; {r['temporary_share']:.0%} before the next allocation, "
                     f"{r['same_call_share']:.0%} by the call that allocated them")
    for r in report.get("thread_locality", [])[:3]:
        where = leak_site(r)
        lines.append(f"  freed by another thread: {where}: {r['other_thread_share']:.0%} "
                     f"(same thread {r['same_thread_share']:.0%}, live {r['live_share']:.0%})")
    lines += peak_lines(report.get("peak"), full_names=full_names)
    lines += snapshot_lines(report.get("snapshots"))
    leaking = [s for s in report["sites"] if s["outstanding_bytes"] > 0][:top]
    lines.append(f"Top {len(leaking)} call stacks by outstanding bytes:" if leaking
                 else "No outstanding allocations.")
    for n, s in enumerate(leaking, 1):
        lines.append(f"#{n} {s['outstanding_bytes']} bytes in {s['outstanding_count']} blocks "
                     f"({s['alloc_count']} allocated, {s['free_count']} freed) "
                     f"[{', '.join(s['operations'])}]: {leak_site(s)}"
                     + (f"; uncertain: {s['uncertain_bytes']} bytes in {s['uncertain_count']} "
                        "blocks may have been freed" if s.get("uncertain_count") else "")
                     + (f" [suppressed: leak:{s['suppressed_by']}]" if s.get("suppressed_by")
                        else ""))
        if s.get("reachable_count") is not None and categories.text(s):
            lines.append(f"    leak check: {categories.text(s)}")
        if s.get("processes"):
            lines.append("      in " + ", ".join(f"PID {p['pid']}: {p['outstanding_bytes']} bytes"
                                                 for p in s["processes"]))
        # From a few frames below the attributed one where it lies deeper than the frames shown
        # (a Python stack's first Python frame, under the interpreter's own).
        at = s.get("attributed_frame") or 0
        first = at - 3 if at >= frames - 1 else 0
        if first:
            lines.append(f"      ... {first} frames into the runtime")
        for f in s["frames"][first:first + frames]:
            lines.append(f"      {frame_text(f)}")
        if len(s["frames"]) > first + frames:
            lines.append(f"      ... {len(s['frames']) - first - frames} more frames")
    lines += suppression_lines(report)
    return "\n".join(lines)


def snapshot_lines(snaps: list | None) -> list[str]:
    """The snapshots the capture holds, one line each (memhook report FILE --snapshot N)."""
    if not snaps:
        return []
    lines = [f"Snapshots ({len(snaps)}; `memhook report FILE --snapshot N`, `--diff M`):"]
    for s in snaps:
        lines.append(f"  #{s['number']} {s['time_s']:.3f} s after attach ({s['reason']}): "
                     f"{human_bytes(s['outstanding_bytes'])} outstanding in "
                     f"{s['outstanding_count']} blocks; RSS {human_bytes(s['rss_bytes'])}")
    return lines


def peak_lines(peak: dict | None, shown: int = 5, frames: int = 4,
               full_names: bool = False) -> list[str]:
    """The session's highest outstanding heap and the stacks that held it then."""
    if not peak:
        return []
    lines = [f"Peak: {human_bytes(peak['bytes'])} outstanding"
             + (" (estimated from the samples)" if peak["estimated"] else "")
             + f", {peak['time_s']:.3f} s after attach"
             + (f"; the process's peak RSS (VmHWM) {human_bytes(peak['vm_hwm_bytes'])}"
                if peak.get("vm_hwm_bytes") else "") + "; at that moment:"]
    for r in peak["stacks"][:shown]:
        lines.append(f"  {r['peak_bytes']} bytes ({human_bytes(r['peak_bytes'])}); "
                     f"{human_bytes(r['outstanding_bytes'])} at the end: "
                     f"{one_line_site(r, full_names=full_names)}")
        at = r.get("attributed_frame") or 0  # (the whole stack is in the listing below)
        lines += [f"      {frame_text(f)}" for f in r["frames"][at:at + frames]]
    return lines


def suppression_lines(report: dict) -> list[str]:
    """LeakSanitizer's "Suppressions used" table, and what is left outstanding without them."""
    used = report.get("suppressions")
    if used is None and "unsuppressed" not in report:
        return []
    rule = "-" * 53
    lines = [rule] + (["Suppressions used:", "  count      bytes template"] if used else [])
    lines += [f"  {s['blocks']:>5} {s['bytes']:>10} {s['pattern']}"
              + (f"  ({s['source']})" if s["source"] in (suppressions.DEFAULTS_SOURCE,
                                                         suppressions.EMBEDDED_SOURCE) else "")
              for s in used or []]
    left = report["unsuppressed"]
    lines += [rule, f"not suppressed: {left['outstanding_bytes']} bytes in "
              f"{left['outstanding_count']} blocks"
              + (f", of which lost (no pointer reaches them): {left['lost_bytes']} bytes in "
                 f"{left['lost_count']} blocks" if "lost_bytes" in left else "")]
    return lines


def render_diff_text(d: dict, top: int = 10, frames: int = 6, full_names: bool = False) -> str:
    def side(x):
        return f"PID {x['pid']}" + (f" snapshot {x['snapshot']}" if x.get("snapshot") else
                                    " at the end" if "snapshot" in x else "")
    lines = [f"memhook diff: {side(d['base'])} -> {side(d['other'])}: outstanding "
             f"{d['change_bytes']:+d} bytes"]
    for n, r in enumerate(d["sites"][:top], 1):
        lines.append(f"#{n} {r['change_bytes']:+d} bytes ({r['outstanding_bytes_before']} -> "
                     f"{r['outstanding_bytes_after']}), {r['outstanding_count_change']:+d} blocks: "
                     f"{one_line_site(r, full_names=full_names)}")
        for f in r["frames"][:frames]:
            lines.append(f"      {frame_text(f)}")
    return "\n".join(lines)


def render(cap, report: dict, symbolizer, top: int | None = None, full_names: bool = False,
           **_) -> str:
    return render_text(report, top=top or 10, full_names=full_names)
