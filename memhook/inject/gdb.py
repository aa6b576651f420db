"""Running the GDB agent against the target: batch mode, no init files, no symbols, no debuginfod,
no libthread_db, so the target is stopped for as short a time as possible.

What GDB does while the target is stopped is what the target waits for. GDB reads the executable
when it attaches, and always reads the minimal symbols of libc (for thread debugging), with any
separate debug file a -dbg package installed: 10-80 ms on real programs (docs/benchmarks.md,
"the pause on real programs"). So the agent loads the
executable before it attaches (GDB's infcalls return through its entry point), and GDB's sysroot
is an empty directory of memhook's, so GDB opens no shared library at all: it needs none, every
address it is given was computed by memhook from the ELF files."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict
from importlib import resources

from ..common import procfs
from ..common.procfs import TargetError, ptrace_refused
from . import gdb_xstate
from .requests import AttachRequest, DetachRequest, TrimRequest

GDB_TIMEOUT_S = 120
MARKER = "MEMHOOK_RESULT "

GDB_SETTINGS = [
    "set pagination off",
    "set confirm off",
    "set auto-load off",
    "set auto-solib-add off",
    "set debuginfod enabled off",
    "set libthread-db-search-path",
    "set print thread-events off",
    "set print inferior-events off",
    "set debug-file-directory",
    "set exec-file-mismatch off",  # the executable is read as /proc/PID/exe, before the attach
    # A signal that stops one of memhook's calls in the target (a fault in it) puts the target's
    # thread back as it was before the call, and the call fails. Left in the call, the thread
    # would return, after the detach, to the address GDB put on its stack for the call's end:
    # a program that took a SIGPIPE during its attach crashed so in the dynamic loader.
    "set unwindonsignal on",
    # Signals that come from outside, which GDB stops for by default, are the program's: handed
    # to it as they come (its handler runs, or their action is taken), the call going on.
    "handle SIGHUP SIGQUIT SIGUSR1 SIGUSR2 SIGPIPE SIGTERM SIGXCPU SIGXFSZ SIGPWR "
    + " ".join(f"SIG{n}" for n in range(34, 65)) + " nostop noprint pass",
]


def find_gdb() -> str:
    gdb = shutil.which("gdb")
    if gdb is None:
        raise TargetError("gdb is not installed: install it (Debian/Ubuntu: apt-get install gdb; "
                          "Fedora/RHEL: dnf install gdb; Alpine: apk add gdb)")
    return gdb


GDB_NICE = -10  # GDB's priority while it holds the target stopped (see raise_priority)


def raise_priority(pid: int) -> None:
    """The target waits on GDB while it is stopped: on a busy host GDB at the default priority
    shares a core with every runnable task, and a pause of 5 ms of GDB's work lasted 20-40 ms
    (benchmarks/pgbench_pause.py). GDB runs in a session of its own (run_agent), and the kernel
    schedules each session as one group (autogroup), whose weight the nice of a task in it does
    not change: the group's own nice (/proc/PID/autogroup) is set too, so GDB gets most of a
    core for those few milliseconds. (Without CAP_SYS_NICE, or without autogroups: GDB runs
    as memhook's own.)"""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, GDB_NICE)
    except OSError:
        pass
    try:  # (GDB's session alone is in this group: it goes with GDB)
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(GDB_NICE))
    except OSError:
        pass


def stopped(pid: int) -> bool:
    try:
        return procfs.state(pid) == "T"
    except (OSError, ValueError):
        return False


def release_stop(pid: int, stopped_before: bool) -> None:
    """GDB's attach sends each thread a SIGSTOP, which GDB takes as the thread stops. A GDB that
    ends without finishing (killed at its timeout, or dead) may leave it pending in a thread
    that had not taken signals yet (a vfork parent, a wait in the kernel that takes none): the
    target then stops for good the moment it takes it. SIGCONT discards every pending stop
    signal (signal(7)) and resumes a process one has stopped already; never sent to a target
    that was stopped before memhook came."""
    if not stopped_before and procfs.stop_pending(pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


def run_agent(request: AttachRequest | DetachRequest | TrimRequest) -> dict:
    """Run the agent on `request`; return what it reported. Raises TargetError on failure.
    Where this processor needs it, GDB sees the x87/SSE state alone (gdb_xstate.py)."""
    params = asdict(request)
    gdb = find_gdb()
    sse_only = params["sse_only"] = gdb_xstate.needs_fpregs()
    body = resources.files(__package__).joinpath("gdb_agent.py").read_text()
    with tempfile.TemporaryDirectory(prefix="memhook-gdb-") as tmp:  # 0700, root's
        script = os.path.join(tmp, "agent.py")
        with open(script, "w") as f:
            f.write(f"import json\nPARAMS = json.loads({json.dumps(params)!r})\n" + body)
        sysroot = os.path.join(tmp, "sysroot")  # empty: GDB finds no shared library to read
        os.mkdir(sysroot, 0o700)
        cmd = [gdb, "-nx", "-nh", "-q", "-batch", "--readnever"]
        for s in GDB_SETTINGS + [f"set sysroot {sysroot}"]:
            cmd += ["-iex", s]
        cmd += ["-x", script]
        # GDB may be inside a call in the target: neither a terminal's Ctrl-C (own session) nor
        # one aimed at memhook (signals held until GDB is done) may cut it short.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        stopped_before, out = stopped(request.pid), ""
        try:
            with subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True,
                                  preexec_fn=gdb_xstate.hide_xstate() if sse_only else None
                                  ) as proc:
                raise_priority(proc.pid)
                try:
                    out, err = proc.communicate(timeout=GDB_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    # GDB's session: GDB and any child of its own (gdb_agent.py's
                    # prime_ptrace), which would hold its output pipes open.
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except OSError:
                        proc.kill()
                    proc.communicate()
                    raise TargetError(f"gdb did not finish within {GDB_TIMEOUT_S} s") from None
        finally:
            if MARKER not in out:  # GDB did not finish: its SIGSTOP may still be pending
                release_stop(request.pid, stopped_before)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    for line in reversed(out.splitlines()):
        if line.startswith(MARKER):
            result = json.loads(line[len(MARKER):])
            if result.pop("ptrace_refused", False):
                result["error"] += ": " + ptrace_refused()
            return result
    detail = (err.strip().splitlines() or ["no output"])[-1]
    if "ptrace" in err and ("not permitted" in err or "Operation" in err):
        raise TargetError("gdb may not trace the target (ptrace: operation not permitted): "
                          + ptrace_refused())
    if "Python scripting is not supported" in err:
        raise TargetError("this gdb was built without Python support, which memhook needs")
    raise TargetError(f"gdb failed: {detail}")


class GdbWayIn:
    """The way in through GDB: attach, call dlopen and memhook_start in the target, patch the
    entries (other threads held) and the slots, detach (gdb_agent.py runs inside GDB)."""

    name = "gdb"
    TRIES = 5  # every thread mid-allocation ("busy:"): the moment passes, try again

    def attach(self, request: AttachRequest) -> dict:
        return self._until_not_busy(request)

    def detach(self, request: DetachRequest) -> dict:
        return self._until_not_busy(request)

    def trim(self, request: TrimRequest) -> dict:
        return self._until_not_busy(request)

    def _until_not_busy(self, request) -> dict:
        for attempt in range(self.TRIES):
            result = run_agent(request)
            if not result.get("error", "").startswith("busy:") or attempt + 1 == self.TRIES:
                return result
            time.sleep(0.05)
        return result
