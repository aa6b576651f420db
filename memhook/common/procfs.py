"""What /proc says about the target: mappings, identity, memory."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
from dataclasses import dataclass


class TargetError(Exception):
    """A problem with the target process, reported to the user as one line."""


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    uid: int  # effective uid: the owner of files the target must open
    gid: int
    command: str
    exe: str
    start_ticks: int  # field 22 of /proc/PID/stat: tells a reused PID apart


def read_maps(pid: int) -> list[Mapping]:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = parts[0].split("-")
            path = parts[5].rstrip("\n") if len(parts) > 5 else ""
            out.append(Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[2], 16),
                               int(parts[4]), path))
    return out


def started_at(pid: int) -> float:
    """When the process started, in seconds since the epoch (btime plus its start ticks)."""
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return btime + start_ticks(pid) / os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int, tid: int | None = None) -> list[str]:
    """/proc/PID/stat's fields (a thread's: /proc/PID/task/TID/stat) from the state on (field 3
    at index 0): the command name before them may contain spaces and parentheses, so they
    follow the last ')'."""
    with open(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2:].split()


def start_ticks(pid: int) -> int:
    return int(stat_fields(pid)[19])


def state(pid: int) -> str:
    return stat_fields(pid)[0]


SIGSTOP_BIT = 1 << (signal.SIGSTOP - 1)  # in a thread's SigPnd and ShdPnd


def stop_pending(pid: int) -> bool:
    """Whether a SIGSTOP waits to be taken by any thread of `pid`, or has stopped it already."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                fields = dict(line.split(":\t", 1) for line in f if ":\t" in line)
        except OSError:
            continue
        if fields.get("State", "").startswith("T") or any(
                int(fields.get(k, "0"), 16) & SIGSTOP_BIT for k in ("SigPnd", "ShdPnd")):
            return True
    return False


def tgid(tid: int) -> int:
    """The process a thread belongs to (a vfork child: its own, though it runs in its
    parent's memory)."""
    with open(f"/proc/{tid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("Tgid:")))


def process_info(pid: int) -> ProcessInfo:
    if not os.path.isdir(f"/proc/{pid}"):
        raise TargetError(f"no process with PID {pid}")
    try:
        status = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                status[key] = value.split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        ticks = start_ticks(pid)
    except FileNotFoundError:
        raise TargetError(f"no process with PID {pid}") from None
    except PermissionError:
        raise _denied(pid) from None
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except PermissionError:
        raise _denied(pid) from None
    except OSError:
        if "Z" in status.get("State", []) or not os.path.isdir(f"/proc/{pid}"):
            raise TargetError(f"PID {pid} has exited") from None
        raise TargetError(f"PID {pid} is a kernel thread: it has no program to hook") from None
    return ProcessInfo(pid, int(status["Uid"][1]), int(status["Gid"][1]),
                       " ".join(argv), exe, ticks)


CAP_SYS_PTRACE = 19


def ptrace_refused() -> str:
    """Why this process may not ptrace another, as far as /proc tells: Yama's ptrace_scope, the
    capability, or a seccomp filter (a container's default profile refuses ptrace)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read())
    except (OSError, ValueError):
        scope = 0
    status = {}
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                status[key] = value.strip()
    has_cap = bool(int(status.get("CapEff", "0"), 16) >> CAP_SYS_PTRACE & 1)
    if scope == 3:
        return ("kernel.yama.ptrace_scope is 3: no process may be traced on this host until it "
                "reboots")
    if not has_cap:
        return ("memhook lacks CAP_SYS_PTRACE: run it as root (sudo), or in a container with "
                "--cap-add SYS_PTRACE" + (" (kernel.yama.ptrace_scope is 2: only it may trace)"
                                          if scope == 2 else ""))
    if status.get("Seccomp", "0") != "0":
        return ("memhook runs under a seccomp filter that refuses ptrace (a container's default "
                "profile?): run it with one that allows ptrace, e.g. "
                "--security-opt seccomp=unconfined")
    return "run memhook as root, or relax kernel.yama.ptrace_scope"


def _denied(pid: int) -> TargetError:
    if os.geteuid() == 0:
        return TargetError(f"not allowed to inspect PID {pid}: memhook runs as root but without "
                           "CAP_SYS_PTRACE (a restricted container or capability set?)")
    return TargetError(f"not allowed to inspect PID {pid}: run memhook as root (sudo)")


def status(pid: int) -> dict:
    """/proc/PID/status as field -> value (the text after the colon, stripped). OSError if
    it cannot be read."""
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in f)}


def memory(pid: int) -> dict:
    """Resident, anonymous resident and [heap] bytes of the process now (0 when gone)."""
    out = {"rss_bytes": 0, "anon_bytes": 0, "heap_bytes": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon"):
                    out["rss_bytes" if key == "VmRSS" else "anon_bytes"] = int(value.split()[0]) * 1024
        out["heap_bytes"] = sum(m.end - m.start for m in read_maps(pid) if m.path == "[heap]")
    except (OSError, ValueError, IndexError):
        pass
    return out


def peak_rss(pid: int) -> int:
    """The process's resident high-water mark (VmHWM) in bytes, 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tracer(pid: int) -> int:
    """The PID of the debugger tracing `pid`, or 0."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    return 0


def fs_type(pid: int, path: str) -> str:
    """The file system type under `path` as the target sees it (its root, its mounts): the
    longest mount point of /proc/PID/mountinfo (relative to the target's root) that holds it;
    "" if none does (a chroot whose own root is no mount point of its own)."""
    best, kind = -1, ""
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            for line in f:
                head, _, tail = line.partition(" - ")
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                               head.split()[4])
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) > best and tail:
                    best, kind = len(point), tail.split()[0]
    except (OSError, IndexError):
        return ""
    return kind


def command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


PF_EXITING = 0x4  # in /proc/PID/stat's flags: the task has begun to exit (linux/sched.h)


def alive(info: ProcessInfo) -> bool:
    """The same process (not a reused PID) still exists, is not a zombie and has not begun to
    exit: a process killed is exiting before it is a zombie, and its root and files are gone
    already (what memhook then fails to find there is not the reason to give)."""
    try:
        fields = stat_fields(info.pid)  # (one read: state, flags and start time together)
        return int(fields[19]) == info.start_ticks and fields[0] not in "ZX" and \
            not int(fields[6]) & PF_EXITING
    except (OSError, ValueError, IndexError):
        return False


class Memory:
    """Reads of the target's memory through /proc/PID/mem (reads only: writes go through GDB
    while the target is stopped, so no thread ever sees a half-written pointer)."""

    def __init__(self, pid: int):
        self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def read(self, addr: int, size: int) -> bytes:
        return os.pread(self._fd, size, addr)

    def u64(self, addr: int) -> int:
        return struct.unpack("<Q", self.read(addr, 8))[0]

    def u32(self, addr: int) -> int:
        return struct.unpack("<I", self.read(addr, 4))[0]

    def cstring(self, addr: int, limit: int = 4096) -> str:
        data = b""
        while len(data) < limit:
            chunk = self.read(addr + len(data), 256)
            if not chunk:
                break
            if b"\0" in chunk:
                return (data + chunk[:chunk.index(b"\0")]).decode(errors="replace")
            data += chunk
        return data.decode(errors="replace")

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "Memory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pids_named(name: str) -> list[int]:
    """Live processes whose executable's file name or command name (comm) is `name`, memhook
    itself and kernel threads (no executable) left out."""
    own = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            exe = os.path.basename(os.readlink(f"/proc/{entry}/exe")).removesuffix(" (deleted)")
            comm = command_name(int(entry))
            if name in (exe, comm) and state(int(entry)) not in "ZXtT":
                found.append(int(entry))
        except OSError:
            continue
    return sorted(found)
