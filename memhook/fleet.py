"""Several processes in one run (`-p A,B,C`, `--pid-of NAME`). Each process is its own session
(its own segment, its own GDB attach), attached one after another so that no two are paused
together, and followed side by side; one that exits, execs or refuses attach ends alone, the
others go on. With --pid-of, processes of that name that start while the run lasts are attached
as they appear (/proc is read every SCAN_S). One capture holds them all (capture.SharedWriter);
the final report shows each process and the merged view."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from . import capture, procfs
from .commands.arguments import EXIT_FAILED, EXIT_OK
from .commands.attach import (Follower, attach_or_explain, print_final_report,
                               report_attached)
from .procfs import TargetError
from .session import Session

SCAN_S = 1.0


@dataclass
class Member:
    session: Session
    recorder: capture.Recorder
    follower: Follower
    cap: capture.Capture | None = None


class Fleet:
    def __init__(self, a, opts, pushers: list):
        self.a, self.opts, self.pushers = a, opts, pushers
        # Opened before attaching: an unwritable -o fails while every target is untouched.
        self.writer = capture.SharedWriter(a.output) if a.output else None
        self.members: list[Member] = []
        self.tried: set = set()  # (pid, start time): a PID reused later is another process
        self.symbols: dict = {}  # the live views' per-file symbols, loaded once for all
        self.refused = 0

    @property
    def active(self) -> list[Member]:
        return [m for m in self.members if m.cap is None]

    def attach(self, pid: int) -> None:
        try:
            self.tried.add((pid, procfs.start_ticks(pid)))
        except (OSError, ValueError, IndexError):
            pass
        session = Session(pid, self.opts)
        index = len(self.members) + self.refused
        recorder = capture.Recorder(session, snapshot_every=self.a.snapshot_interval,
                                    record_events=self.a.record_events,
                                    writer=self.writer.process(index) if self.writer else None)
        try:
            result = attach_or_explain(session)
        except Exception as e:  # noqa: BLE001 (one process's failure is never the others')
            self.refused += 1
            reason = str(e) if isinstance(e, (TargetError, OSError)) else \
                f"{type(e).__name__}: {e}"
            print(f"memhook: not tracing PID {pid}: {reason}", file=sys.stderr, flush=True)
            return
        report_attached(session, result)
        recorder.start()
        self.members.append(Member(session, recorder, Follower(
            session, recorder, self.a, view_label=f"PID {pid}: ", symbols=self.symbols)))
        for p in self.pushers:
            p.add(session)

    def discover(self, name: str) -> None:
        for pid in procfs.pids_named(name):
            try:
                key = (pid, procfs.start_ticks(pid))
            except (OSError, ValueError, IndexError):
                continue
            if key not in self.tried:
                self.attach(pid)

    def end(self, m: Member, reason: str) -> None:
        m.session.detach(reason)
        s = m.session
        print(f"memhook: detached from PID {s.pid} ({reason}): {s.restored} slots restored"
              + (f"; target paused {s.pause_ms['detach']:.1f} ms" if "detach" in s.pause_ms
                 else ""), flush=True)
        if s.detach_error:
            print(f"memhook: could not restore the slots of PID {s.pid} ({s.detach_error}); it "
                  "keeps running with memhook's hooks in place", file=sys.stderr, flush=True)
        for p in self.pushers:
            p.retire(s)
        m.cap = m.recorder.finish()


def run(a, opts, stop: dict, pushers: list) -> int:
    """`memhook -p A,B,C` or `memhook --pid-of NAME`: until Ctrl-C, --duration, or (for -p)
    every process ended."""
    import signal
    fleet = Fleet(a, opts, pushers)
    for p in pushers:
        p.start()
    try:
        for pid in a.pid or []:
            if not stop["reason"]:
                fleet.attach(pid)
        if a.pid and not fleet.members:
            raise TargetError("no process could be traced")
        t0 = time.monotonic()  # --duration counts from the first processes' attach
        next_scan = t0
        waiting_said = False
        while not stop["reason"]:
            now = time.monotonic()
            if a.pid_of and now >= next_scan:
                fleet.discover(a.pid_of)
                next_scan = now + SCAN_S
                if not fleet.members and not waiting_said:
                    waiting_said = True
                    print(f"memhook: no process named {a.pid_of} yet; waiting for one "
                          "(Ctrl-C stops)", file=sys.stderr, flush=True)
            for m in fleet.active:
                why = m.follower.step(now)
                if why:
                    fleet.end(m, why)
            if a.duration and now - t0 >= a.duration:
                stop["reason"] = "duration reached"
            elif a.pid and not fleet.active:
                stop["reason"] = "every target ended"
            time.sleep(0.05)
    finally:  # whatever happened, every process gets its slots back
        stop["reason"] = stop["reason"] or "error"
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # detaching must not be cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for m in fleet.active:
            try:
                fleet.end(m, stop["reason"])
            except Exception as e:  # noqa: BLE001 (the others still need their detach)
                print(f"memhook: PID {m.session.pid}: {e}", file=sys.stderr, flush=True)
        for p in pushers:
            p.stop()
        if fleet.writer:
            fleet.writer.close()
    from .commands.attach import report_pushes
    for p in pushers:
        report_pushes(p)
    caps = [m.cap for m in fleet.members if m.cap is not None]
    if not caps:
        raise TargetError(f"no process named {a.pid_of} was traced" if a.pid_of
                          else "no process could be traced")
    if a.output:
        print(f"memhook: capture of {len(caps)} processes written to {a.output} "
              f"({fleet.writer.bytes} bytes)", flush=True)
    cap = capture.merge(caps) if len(caps) > 1 else caps[0]
    print_final_report(cap, a, fleet.symbols)
    failed = any(m.session.detach_error for m in fleet.members) or (a.pid and fleet.refused)
    return EXIT_FAILED if failed else EXIT_OK
