"""The live view: what memhook shows while attached."""
from __future__ import annotations

import os
import shutil
import time

from ..common.format import frame_name, human_bytes, leak_site, one_line
from ..symbolize import stack_frames


class LiveView:
    """What memhook shows while attached: on a terminal a table redrawn in place (top-like),
    otherwise plain lines, every --interval."""

    HISTORY = 20  # samples a stack's growth rate is read from (the recorder's latest)

    def __init__(self, session, recorder, top: int, tty: bool, label: str = "", rules=None,
                 full_names: bool = False):
        self.session, self.recorder, self.top, self.tty, self.label = \
            session, recorder, top, tty, label
        self.rules = rules  # attribution.Rules: what is not the leak's own frame
        self.full_names = full_names
        self.t0 = time.monotonic()
        self.last = (self.t0, 0, 0)  # time, allocs, frees

    def lines(self, symbolizer) -> list[str]:
        import numpy as np
        from ..common import procfs
        from ..reporters import analysis
        consumer = self.session.consumer
        now = time.monotonic()
        t = consumer.totals()
        out = consumer.sites()["outstanding_bytes"]
        dt = max(now - self.last[0], 1e-6)
        alloc_rate = (t["alloc_count"] - self.last[1]) / dt
        free_rate = (t["free_count"] - self.last[2]) / dt
        self.last = (now, t["alloc_count"], t["free_count"])
        mem = procfs.memory(self.session.pid)
        stamp = time.strftime("%H:%M:%S")
        head = (f"outstanding {human_bytes(t['outstanding_bytes'])} in {t['outstanding_count']} "
                f"blocks; {alloc_rate:.0f} allocs/s, {free_rate:.0f} frees/s; "
                f"{t['dropped_events']} dropped; RSS {human_bytes(mem['rss_bytes'])} "
                f"(anon {human_bytes(mem['anon_bytes'])})")
        rows, width = [], self.width()
        shown = [int(i) for i in np.argsort(-out.astype(np.float64))[:self.top] if out[i]]
        times, series = self.recorder.recent(shown, self.HISTORY)
        check, lost = self.latest_check()
        for i in shown:
            growth = analysis.theil_sen(times, series[i]) * 60 if len(times) > 1 else 0.0
            where = self.stack_line(symbolizer, i,
                                    width - 30 - 12 * (lost is not None) if width else None)
            rows.append((human_bytes(int(out[i])), f"{'+' if growth >= 0 else '-'}"
                         f"{human_bytes(abs(growth))}/min", where,
                         "" if lost is None else human_bytes(lost.get(i, 0))))
        memory = self.part_lines(symbolizer)
        checked = self.check_lines(check)
        lost_head = "" if lost is None else f"  {'LOST':>10}"
        if not self.tty:
            return ([f"[{stamp}] {self.label}{head}"] + [f"  {self.label}{line}" for line in checked]
                    + [f"  {b:>10}" + (f"  {x:>10}" if lost is not None else "")
                       + f"  {g:>14}  {w}" for b, g, w, x in rows]
                    + [f"  {line}" for line in memory])
        elapsed = int(now - self.t0)
        return ([f"memhook  PID {self.session.pid}  attached "
                 f"{elapsed // 3600:02d}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}  "
                 f"[{stamp}]  Ctrl-C detaches  {one_line(self.session.info.command)}"
                 + (f"  ({self.session.libc})" if self.session.libc else ""), head] + checked
                + ["", f"{'OUTSTANDING':>12}{lost_head}  {'GROWTH':>14}  WHERE"]
                + [f"{b:>12}" + (f"  {x:>10}" if lost is not None else "") + f"  {g:>14}  {w}"
                   for b, g, w, x in rows] + [""] + memory)

    def latest_check(self) -> tuple[dict | None, dict | None]:
        """The last leak check of the session (taken with a snapshot: SIGUSR1, `memhook leaks
        -p`, --snapshot-when, --snapshot-interval) and its lost bytes per stack (definitely and
        indirectly), or None before the first or when it was skipped."""
        from ..reachability import categories
        snaps = [s for s in self.recorder.snapshots if s.get("leak_check")]
        if not snaps:
            return None, None
        check = dict(snaps[-1]["leak_check"], number=snaps[-1]["number"],
                     time_s=snaps[-1]["time_s"])
        per = categories.per_stack({"leak_check": check})
        return check, None if per is None else {k: categories.lost_bytes(v)
                                                for k, v in per.items()}

    def check_lines(self, check: dict | None) -> list[str]:
        """'leak check at snapshot 2 (41 s ago): lost 23 KiB in 477 blocks; ...', or why the
        last was skipped."""
        from ..reachability import categories
        if check is None:
            return []
        ago = f"{max(0.0, self.recorder.seconds() - check['time_s']):.0f} s ago"
        where = f"leak check at snapshot {check['number']} ({ago})"
        if check.get("skipped"):
            return [f"{where}: skipped: {check['skipped']}"]
        s = categories.summary({"leak_check": check})
        t, before = s["totals"], s["before_attach"]
        lost = categories.lost_bytes(t) + categories.lost_bytes(before)
        blocks = sum(x["definitely_lost_count"] + x["indirectly_lost_count"] for x in (t, before))
        return [f"{where}: lost {human_bytes(lost)} in {blocks} blocks"
                + (f" ({human_bytes(categories.lost_bytes(before))} of them from before attach)"
                   if categories.lost_bytes(before) else "")
                + f"; possibly lost {human_bytes(t['possibly_lost_bytes'])}; threads stopped "
                f"{check['pause_ms']:.1f} ms"]

    PARTS_SHOWN = 6

    def part_lines(self, symbolizer) -> list[str]:
        """The process's resident memory in parts (resident.py), one line each, largest first;
        the program's mappings in the session under the function that mapped them. (The heap's
        live and free shares come from the census, at attach and detach only.)"""
        from ..common import resident
        pid = self.session.pid
        try:
            parts = resident.split_by_mappings(resident.parts(pid), pid,
                                               self.session.mappings_now()["ranges"])
        except OSError:
            return []
        rss = sum(p.bytes["Rss"] for p in parts)
        lines = [f"resident {human_bytes(rss)} in parts:"]
        for p in parts[:self.PARTS_SHOWN]:
            name = p.name
            fr = self.session.consumer.stack(p.stack) if p.stack else ()
            if len(fr):
                names = [frame_name(f.as_dict()) for x in fr[:1] for f in symbolizer.frames(int(x))]
                name = f"anonymous mmap by {names[0] if names else '?'}"
            lines.append(f"  {human_bytes(p.bytes['Rss']):>10}  {one_line(name)}")
        rest = parts[self.PARTS_SHOWN:]
        if rest:
            lines.append(f"  {human_bytes(sum(p.bytes['Rss'] for p in rest)):>10}  "
                         f"{len(rest)} more parts")
        return lines

    def stack_line(self, symbolizer, stack: int, width: int | None = None) -> str:
        """The consumer's stack `stack` as one line (format.leak_site), by this view's
        attribution rules and names; the live view's and a snapshot's. (One stack copied, not
        every stack's frames: a Python program's are 200 MB.)"""
        if self.session.perf_map is not None:  # (the JIT's names, as read so far)
            symbolizer.use_jit_entries(self.session.perf_map.entries)
        return leak_site({"frames": stack_frames(symbolizer, self.session.consumer.stack(stack))},
                         self.rules, self.full_names, width)

    def width(self) -> int | None:
        """The columns a line may take: the terminal's, or COLUMNS where set (None: any)."""
        if self.tty or os.environ.get("COLUMNS", "").isdigit():
            return max(shutil.get_terminal_size().columns, 20)
        return None

    def show(self, symbolizer) -> None:
        width = self.width()
        lines = self.lines(symbolizer)
        if width:  # (never wrapped: a line too long ends in "...", the leak's frame first)
            lines = [line if len(line) <= width else line[:width - 3] + "..."
                     for line in lines]
        text = "\n".join(lines)
        if self.tty:
            text = "\x1b[H\x1b[2J" + text
        print(text, flush=True)
