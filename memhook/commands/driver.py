"""The one run driver: `memhook -p PID`, `-p A,B,C` and `--pid-of NAME` alike. One process is a
run of one. Each process is its own session (its own segment, its own way in), attached one
after another so that no two are paused together, and followed side by side by one loop; one
that exits, execs or refuses attach ends alone, the others go on. With --pid-of, processes of
that name that start while the run lasts are attached as they appear (/proc read every
SCAN_S). One capture holds them all; ending, the final report and the pushes have one path."""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np

from .. import _native, capture, reporters
from ..capture import private_file
from ..common import procfs
from ..common.format import one_line
from ..common.procfs import TargetError
from ..consumer import snapshot_when
from ..consumer.session import Session
from ..elf import slots as elf
from ..reporters import model, suppressions
from ..symbolize import Symbolizer
from .live_view import LiveView

SCAN_S = 1.0    # --pid-of: how often /proc is read for new processes of that name
RESCAN_S = 2.0  # libraries loaded without the dlopen hook get their unwind rows this late
STEP_S = 0.05   # the loop's period: how soon a process's end or a Ctrl-C is seen
EXIT_SLICE_S = 0.01  # how soon a process waiting in exit() for its leak check is seen
EXIT_OK, EXIT_FAILED = 0, 1
SI_KERNEL = 0x80  # siginfo's si_code of a signal the kernel sent (a terminal's Ctrl-C)


class Follower:
    """Follows one attached session: samples, records and (unless told not to) shows it every
    interval, and tells when its process ended."""

    def __init__(self, session, recorder, a, view_label: str = "", symbols: dict | None = None):
        self.session, self.recorder, self.a = session, recorder, a
        # The program's exit() waits for the leak check, which step() takes when it asks.
        session.consumer.set_check_at_exit(session.options.reachability)
        self.symbolizer = Symbolizer(session.modules.values(), cache=symbols,
                                     python_code=session.python_code, depth=session.options.depth)
        self.view = LiveView(session, recorder, a.top, sys.stdout.isatty() and not view_label,
                             view_label, getattr(a, "runtime", None),
                             getattr(a, "full_names", False))
        self.t0 = time.monotonic()
        self.next_tick = self.t0 + a.interval
        self.first_checkpoint = self.t0 + min(1.0, a.interval)  # a capture cut off early
        self.next_rescan = self.t0 + RESCAN_S                    # still holds something

    def step(self, now: float) -> str:
        """One look: '' while the process runs on, else why its session ends."""
        session, recorder = self.session, self.recorder
        alive = session.target_alive()
        exiting = alive and session.consumer.exit_announced()  # exit() waits: exit_check.h
        rescan = now >= self.next_rescan
        if rescan:
            self.next_rescan = now + RESCAN_S
        # (An exiting program's last libraries read while they are still mapped.)
        if alive and session.poll_loads(rescan or exiting):
            self.symbolizer.set_modules(session.modules.values())
        if exiting:  # then the leak check, or just let it go
            if session.options.reachability:
                session.check_leaks("exit")
            else:
                session.consumer.exit_done()
        if not alive:
            return "target exited"
        if now >= self.next_tick and session.target_execed():
            return "target exec'd another program"
        if self.first_checkpoint and now >= self.first_checkpoint:
            self.first_checkpoint = 0
            recorder.checkpoint()
        if now >= self.next_tick:
            self.next_tick = now + self.a.interval
            known = len(session.modules)
            if session.target_alive():
                session.modules = elf.modules(session.pid, session.modules)
            if len(session.modules) != known:
                self.symbolizer.set_modules(session.modules.values())
            recorder.tick()
            if not self.a.no_live:
                self.view.show(self.symbolizer)
        return ""


@dataclass
class Member:
    session: Session
    recorder: capture.Recorder
    follower: Follower
    cap: capture.Capture | None = None
    cgroup: tuple | None = None  # its memory cgroup, and the OOM kills it had counted at attach
    oom_kills: int = 0


def attach_or_explain(session, way_in=None) -> dict:
    """session.attach(), but a target that died meanwhile is said to have exited, whatever
    the way in or /proc made of it (a zombie refuses ptrace: not a permissions problem)."""
    try:
        return session.attach(way_in)
    except (TargetError, OSError):
        if session.info is not None and not procfs.alive(session.info):
            raise TargetError(f"PID {session.pid} exited while memhook was attaching: "
                              "nothing to trace") from None
        raise


def memory_at_attach(session, parts: int = 4, types: int = 3) -> list[str]:
    """What the process's memory was made of as tracing began, before its first allocation:
    its largest resident parts, and the heap census's blocks and free space."""
    from ..common.format import human_bytes
    from ..common.short_names import simplify
    out = []
    table = session.resident.get("attach") or []
    if table:
        rss = sum(p["rss_bytes"] for p in table)
        out.append(f"resident at attach {human_bytes(rss)}: " + ", ".join(
            f"{human_bytes(p['rss_bytes'])} {p['part']}" for p in table[:parts])
            + (f", {len(table) - parts} more parts (the report has them all)"
               if len(table) > parts else ""))
    c = session.census.get("attach")
    if c and c.get("problem"):
        out.append(f"no heap census: {c['problem']}")
    elif c:
        named = ", ".join(f"{simplify(t['type'])} {t['blocks']}" for t in c["by_type"][:types])
        free = sum(a["free_bytes"] for a in c["arenas"])
        out.append(f"held before attach: {c['live']['blocks']} live blocks, "
                   f"{human_bytes(c['live']['bytes'])}" + (f" ({named}, ...)" if named else "")
                   + f"; malloc keeps {human_bytes(free)} free, about "
                   f"{human_bytes(c['trimmable_bytes'])} of it resident and trimmable")
    return out


def snapshot_lines(m: Member, snap: dict, top: int) -> list[str]:
    """A snapshot as memhook prints it when it takes one: what, when, and the largest stacks."""
    from ..common.format import human_bytes
    sites, s = snap["sites"], m.session
    order = np.argsort(-sites["outstanding_bytes"].astype(np.float64))[:top]
    out = [f"memhook: snapshot {snap['number']} of PID {s.pid}, {snap['time_s']:.3f} s after "
           f"attach ({snap['reason']}): {human_bytes(int(sites['outstanding_bytes'].sum()))} "
           f"outstanding in {int(sites['outstanding_count'].sum())} blocks"]
    if snap.get("leak_check"):
        from ..reachability import categories
        from ..reporters.text import leak_check_lines
        out += leak_check_lines(categories.summary({"leak_check": snap["leak_check"]}))
    for i in order:
        if not sites["outstanding_bytes"][i]:
            break
        out.append(f"  {human_bytes(int(sites['outstanding_bytes'][i])):>10}  " +
                   m.follower.view.stack_line(m.follower.symbolizer,
                                              int(sites["id"][i])))
    return out


def say_attached(session, result: dict) -> None:
    late = result.get("late", 0)
    print(f"memhook: attached to PID {session.pid} ({one_line(session.info.command)}, "
          f"{session.libc}): "
          f"{len(session.patched)} slots patched"
          + (f", {late} in libraries loaded meanwhile" if late else "")
          + (f", {len(session.skipped)} left alone" if session.skipped else "")
          + f"; target paused {session.pause_ms['attach']:.1f} ms", flush=True)
    for line in memory_at_attach(session):
        print(f"memhook: {line}", file=sys.stderr, flush=True)
    for found in session.allocators:
        print(f"memhook: {found.line()}", file=sys.stderr)
        for _, why in found.refused:
            print(f"memhook: not entry-patched in {found.path}: {why}", file=sys.stderr)
    if session.segment is not None and session.segment.note:
        print(f"memhook: {session.segment.note}", file=sys.stderr)
    for path, why in session.skipped_objects:
        if why != "the dynamic loader":
            print(f"memhook: not hooking {path}: {why}", file=sys.stderr)
    for slot, value in session.skipped:
        held = "is unreadable" if value is None else f"holds 0x{value:x}"
        print(f"memhook: left alone: the {slot.symbol} slot at 0x{slot.addr:x} in {slot.module} "
              f"{held}, not {slot.symbol} itself", file=sys.stderr)


class Run:
    """The processes of one run. `several`: a run of -p A,B,C or --pid-of, whose lines name each
    process and whose capture holds a PROC block per process; a run of one process says less
    and fails as a whole when its one attach fails."""

    def __init__(self, a, opts, pushers: list, stop: dict):
        self.a, self.opts, self.pushers, self.stop = a, opts, pushers, stop
        self.several = bool(a.pid_of) or len(a.pid or []) > 1 or a.follow_fork
        self.program = None  # memhook run: the program it started (subprocess.Popen)
        self.program_hwm = 0  # its VmHWM, read every step (peak_rss() explains why)
        self.rss_at_start = 0  # memhook's own peak RSS when it started the program
        # Opened before attaching: an unwritable -o fails while every target is untouched.
        self.writer = None
        if a.output:
            self.writer = capture.SharedWriter(a.output) if self.several else \
                capture.Writer(a.output)
        self.members: list[Member] = []
        self.tried: set = set()  # (pid, start time): a PID reused later is another process
        self.symbols: dict = {}  # the live views' per-file symbols, loaded once for all
        self.refused = 0
        self.snapshots_taken = 0

    @property
    def active(self) -> list[Member]:
        return [m for m in self.members if m.cap is None]

    def attach(self, pid: int, launched: bool = False, forked: bool = False,
               must: bool = False) -> None:
        """Attach to `pid` as a member of the run. A run of one, or `must` (the program memhook
        run started), fails with it; in a run of several, one process's failure is said."""
        try:
            self.tried.add((pid, procfs.start_ticks(pid)))
        except (OSError, ValueError, IndexError):
            pass
        opts = self.opts
        if forked:  # (its heap before fork is its parent's, already traced: no census)
            opts = dataclasses.replace(opts, heap_census=False)
        session = Session(pid, opts, launched=launched)
        writer = self.writer
        if self.several and writer:
            writer = writer.process(len(self.members) + self.refused)
        recorder = capture.Recorder(session, snapshot_every=self.a.snapshot_interval,
                                    record_events=self.a.record_events, writer=writer)
        try:
            result = attach_or_explain(session)
        except Exception as e:  # noqa: BLE001 (one process's failure is never the others')
            if not self.several or must:
                raise
            self.refused += 1
            reason = str(e) if isinstance(e, (TargetError, OSError)) else \
                f"{type(e).__name__}: {e}"
            print(f"memhook: not tracing PID {pid}: {reason}", file=sys.stderr, flush=True)
            return
        recorder.start()  # (before "attached" is said: what follows it is recorded, events too)
        say_attached(session, result)
        label = f"PID {pid}: " if self.several else ""
        group = snapshot_when.memory_cgroup(pid)
        self.members.append(Member(session, recorder, Follower(
            session, recorder, self.a, view_label=label, symbols=self.symbols),
            cgroup=group, oom_kills=snapshot_when.oom_kills(group)))
        for p in self.pushers:
            p.add(session)

    def follow_forks(self) -> None:
        """--follow-fork: each child a traced process forked announced itself in its parent's
        segment and waits (hook_library/following.h); attach to it, then let it go."""
        for m in self.active:
            for pid in m.session.consumer.forked():
                if not any(n.session.pid == pid and n.cap is None for n in self.members):
                    self.attach(pid, forked=True)
                m.session.consumer.release_forked(pid)

    def follow_execs(self) -> None:
        """--follow-fork: a traced thread about to exec announced itself (following.h): memhook
        becomes its tracer, holds the new program where its loader is done (inject/startup.py),
        ends the old program's session and attaches to the new one, then lets it go."""
        from ..inject import startup
        for m in self.active:
            tid = m.session.consumer.exec_announced()
            if not tid:
                continue
            if m.session.consumer.exec_state() == _native.SPAWN_ANNOUNCED:
                self.follow_spawn(m, tid)
                continue
            pid = m.session.pid
            try:  # (a vfork child announces in its parent's memory: its exec is its own)
                pid = procfs.tgid(tid)
            except (OSError, StopIteration, ValueError):
                pass
            try:
                held = startup.follow_exec(tid, pid, m.session.consumer)
            except (OSError, TargetError) as e:
                print(f"memhook: not following the exec of PID {pid}: {e}", file=sys.stderr,
                      flush=True)
                m.session.consumer.exec_done()
                continue
            if not held:
                continue
            if pid == m.session.pid:  # (the program itself became another; a vfork child's
                self.end(m, "target exec'd another program")  # parent goes on)
            self.attach_held(pid)

    def attach_held(self, pid: int) -> None:
        """Attach to a program held at its loader's end (inject/startup.py), then let it go
        whatever came of it."""
        try:
            self.attach(pid, launched=True)
        finally:
            os.kill(pid, signal.SIGCONT)

    def follow_spawn(self, m: Member, tid: int) -> None:
        """--follow-fork: a program started by posix_spawn, system or popen: held at its
        loader's end (inject/startup.py), attached to, then let go."""
        from ..inject import startup
        try:
            child = startup.follow_spawn(tid, m.session.consumer)
        except (OSError, TargetError) as e:
            print(f"memhook: not following the program PID {m.session.pid} started: {e}",
                  file=sys.stderr, flush=True)
            return
        if child:
            self.attach_held(child)

    def discover(self, name: str) -> None:
        for pid in procfs.pids_named(name):
            if self.stop["reason"]:  # Ctrl-C between two attaches: attach no more
                return
            try:
                key = (pid, procfs.start_ticks(pid))
            except (OSError, ValueError, IndexError):
                continue
            if key not in self.tried:
                self.attach(pid)

    def end(self, m: Member, reason: str) -> None:
        s = m.session
        if reason == "target exited" and snapshot_when.oom_kills(m.cgroup) > m.oom_kills:
            reason = "target exited; its memory cgroup counted an OOM kill"
        s.detach(reason)
        who = f" from PID {s.pid}" if self.several else ""
        print(f"memhook: detached{who} ({reason}): {s.restored} slots restored"
              + (f"; target paused {s.pause_ms['detach']:.1f} ms" if "detach" in s.pause_ms
                 else ""), flush=True)
        if s.rebound:
            print(f"memhook: PID {s.pid}: {len(s.rebound)} slot(s) were bound by the dynamic "
                  "loader over memhook's hook (a first call's lazy binding under way as memhook "
                  "attached): calls through them were not traced; they hold the real function",
                  file=sys.stderr, flush=True)
        if s.abandoned:
            print(f"memhook: PID {s.pid} had stopped tracing by itself before detach: memhook's "
                  f"heartbeat looked older than {s.options.abandon_after_s:g} s to it (memhook "
                  "starved of CPU, or stopped), so its hooks passed every call through from "
                  "then on", file=sys.stderr, flush=True)
        if s.detach_error and self.several:  # (a run of one says it after its report)
            print(f"memhook: could not restore the slots of PID {s.pid} ({s.detach_error}); it "
                  "keeps running with memhook's hooks in place", file=sys.stderr, flush=True)
        for p in self.pushers:
            p.retire(s)
        m.cap = m.recorder.finish()

    def follow(self) -> None:
        """Until Ctrl-C, --duration, or every process named by -p ended: one loop steps every
        session, and attaches new ones under --pid-of."""
        a, stop = self.a, self.stop
        t0 = time.monotonic()  # --duration counts from the first processes' attach
        next_scan = t0
        waiting_said = False
        while not stop["reason"]:
            self.wait(STEP_S)
            now = time.monotonic()
            if a.pid_of and now >= next_scan:
                self.discover(a.pid_of)
                next_scan = now + SCAN_S
                if not self.members and not waiting_said:
                    waiting_said = True
                    print(f"memhook: no process named {a.pid_of} yet; waiting for one "
                          "(Ctrl-C stops)", file=sys.stderr, flush=True)
            if a.follow_fork:
                self.follow_forks()
                self.follow_execs()
            self.snapshots()
            if a.duration and now - t0 >= a.duration:
                stop["reason"] = "duration reached"
                break
            for m in self.active:
                if stop["reason"]:  # (a signal sets it at any moment: never overwritten)
                    break
                why = m.follower.step(now)
                if self.program and m.session.pid == self.program.pid:
                    if not why:
                        self.program_hwm = max(self.program_hwm,
                                               procfs.peak_rss(self.program.pid))
                    elif why == "target exited":
                        why = self.program_ended(m.session)
                if why and not self.several:
                    stop["reason"] = stop["reason"] or why
                elif why:
                    self.end(m, why)
            if (a.pid or self.program) and not self.active and not stop["reason"]:
                stop["reason"] = "every target ended"

    def snapshots(self) -> None:
        """A snapshot of every process traced, when asked for (SIGUSR1 to memhook, `memhook
        snapshot`) and when a --snapshot-when condition first holds."""
        asked = self.stop.pop("snapshots", 0)
        if asked:
            self.snapshot("asked (SIGUSR1)")
        for c in self.a.conditions:
            if c.fired:
                continue
            for m in self.active:
                why = c.check(m.session, m.cgroup)
                if why:
                    c.fired = True
                    self.snapshot(f"{c.text}: PID {m.session.pid}: {why}")
                    break

    def snapshot(self, reason: str) -> None:
        """Snapshot N of every active process: a SNAP block in the capture now, and its lines."""
        self.snapshots_taken += 1
        for m in self.active:
            snap = m.recorder.snapshot(reason, self.snapshots_taken)
            print("\n".join(snapshot_lines(m, snap, self.a.top)), flush=True)

    def wait(self, seconds: float) -> None:
        """The loop's pause, in slices: a process waiting in exit() for its leak check
        (exit_check.h) ends it early. Under memhook run, the signals memhook holds
        (commands/launch.py) are taken meanwhile and passed on to the program, but for those a
        terminal sent to the whole process group (the kernel's: the program has its own)."""
        until = time.monotonic() + seconds
        while True:
            left = until - time.monotonic()
            if left <= 0 or any(m.session.consumer.exit_announced() for m in self.active):
                return
            self._wait_slice(min(left, EXIT_SLICE_S))

    def _wait_slice(self, seconds: float) -> None:
        if self.program is None:
            time.sleep(seconds)
            return
        got = signal.sigtimedwait(self.a.forwarded | {signal.SIGUSR1}, seconds)
        if got is not None and got.si_signo == signal.SIGUSR1:
            self.stop["snapshots"] = self.stop.get("snapshots", 0) + 1
        elif got is not None and got.si_code != SI_KERNEL and self.program.returncode is None:
            try:
                os.kill(self.program.pid, got.si_signo)
            except ProcessLookupError:
                pass

    def program_ended(self, session) -> str:
        """The started program exited: reaped, its status and peak RSS kept for the report."""
        _, status, usage = os.wait4(self.program.pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        self.program.returncode = code
        session.vm_hwm = self.peak_rss(usage.ru_maxrss * 1024)
        return (f"program exited with code {code}" if code >= 0 else
                f"program killed by {signal.Signals(-code).name}")

    def peak_rss(self, ru_maxrss: int) -> int:
        """The program's peak RSS. wait4's ru_maxrss is exact only above memhook's own peak
        when it forked: the kernel carries the forked memhook's across exec into it. Below
        that, the VmHWM read while it ran (one step's growth may be missed)."""
        return ru_maxrss if ru_maxrss > self.rss_at_start else self.program_hwm

    def finish(self) -> None:
        """Whatever happened, every process still traced gets its slots back."""
        self.stop["reason"] = self.stop["reason"] or "error"
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # detaching must not be cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        error = None
        for m in self.active:
            try:
                self.end(m, self.stop["reason"])
            except Exception as e:  # noqa: BLE001 (the others still need their detach)
                if not self.several:
                    error = e  # a run of one fails with it, after the pushes stop
                else:
                    print(f"memhook: PID {m.session.pid}: {e}", file=sys.stderr, flush=True)
        for p in self.pushers:
            p.stop()
        if self.writer and self.several:
            self.writer.close()  # (a run of one's recorder closed it)
        if error is not None:
            raise error


def say_pushes(pusher) -> None:
    print(f"memhook: {pusher.sent} profiles sent to {pusher.endpoint}"
          + (f"; {pusher.failed} pushes failed ({pusher.last_error})" if pusher.failed else "")
          + (f"; {pusher.dropped} dropped (backlog full)" if pusher.dropped else ""), flush=True)


def final_report(cap, a, symbols: dict | None = None) -> tuple[str, bool]:
    """The report at the end of a run, in --format, and whether --fail-on-leak fails it (None:
    `memhook leaks`, and no check could be taken)."""
    symbolizer = Symbolizer(cap.modules, cache=symbols)
    rep = model.build(cap, symbolizer, model.Filters(
        runtime=a.runtime, outstanding_only=a.format == "text"))  # (the text lists no other)
    suppressions.apply_to_report(rep, cap, a)
    leaks_only = getattr(a, "leaks_only", False)  # memhook leaks (commands/leaks.py)
    if leaks_only and not suppressions.checked(rep):
        failed = None  # (no check: it failed at what it was asked)
    else:
        failed = a.fail_on_leak is not None and suppressions.leaked(rep, a.fail_on_leak)
    fmt = "leaks" if leaks_only and a.format == "text" else a.format
    return reporters.render(fmt, cap, rep, symbolizer, top=a.top,
                            full_names=a.full_names), failed


def run(a, opts, stop: dict, pushers: list) -> int:
    """Attach to every process asked for, follow them until the run ends, detach, report."""
    r = Run(a, opts, pushers, stop)
    if getattr(a, "command", None):
        launch(r, a)
    for p in pushers:
        p.start()
    try:
        for pid in a.pid or []:
            if not stop["reason"]:
                r.attach(pid)
        if a.pid and not r.members:
            raise TargetError("no process could be traced")
        if r.program:
            os.kill(r.program.pid, signal.SIGCONT)  # held since startup.py: now hooked
        r.follow()
    finally:
        r.finish()
    for p in pushers:
        say_pushes(p)
    caps = [m.cap for m in r.members if m.cap is not None]
    if not caps:
        raise TargetError(f"no process named {a.pid_of} was traced" if a.pid_of
                          else "no process could be traced")
    if a.output:
        what = f"capture of {len(caps)} processes" if r.several else "capture"
        print(f"memhook: {what} written to {a.output} ({r.writer.bytes} bytes)", flush=True)
    cap = capture.merge(caps) if len(caps) > 1 else caps[0]
    text, leaked = final_report(cap, a, r.symbols)
    if getattr(a, "report_file", None):
        with private_file.create(a.report_file) as f:
            private_file.write_all(f, (text + "\n").encode())
        print(f"memhook: report written to {a.report_file}", flush=True)
    else:
        print(text, flush=True)
    failed = [m.session for m in r.members if m.session.detach_error]
    if failed and not r.several:
        s = failed[0]
        print(f"memhook: could not restore the slots ({s.detach_error}); the target "
              "keeps running with memhook's hooks in place", file=sys.stderr)
    if r.program:
        return program_exit(r, leaked)
    if failed or (a.pid and r.refused) or leaked is None:
        return EXIT_FAILED
    return suppressions.EXIT_LEAKS if leaked else EXIT_OK


def launch(r: Run, a) -> None:
    """memhook run: the program started and held before its constructors (inject/startup.py),
    then attached as any process is; one that cannot be is killed (it ran none of its code)."""
    import resource

    from ..inject import startup
    r.rss_at_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    r.program = startup.start(a.command, a.signal_mask)
    try:
        startup.hold_before_constructors(r.program)
        r.attach(r.program.pid, launched=True, must=True)
    except BaseException:
        if r.program.returncode is None:
            r.program.kill()
            r.program.wait()
        raise


def program_exit(r: Run, leaked: bool) -> int:
    """memhook run's exit code: the program's (128+N after signal N), or 23 when it exited and
    leaked beyond --fail-on-leak. A program memhook detached from before it ended (--duration)
    is waited for, the signals memhook holds still passed on."""
    while r.program.returncode is None:
        if r.program.poll() is None:
            r.wait(STEP_S)
    code = r.program.returncode
    if code < 0:
        return 128 - code
    return suppressions.EXIT_LEAKS if leaked else code
