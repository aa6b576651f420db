"""--snapshot-when: the conditions that take a snapshot the first time they hold (issue 34):
`rss>SIZE` (the process's resident memory), `heap>SIZE` (the bytes memhook sees outstanding),
`pressure` (the process's memory cgroup: above its soft limit (v1) or memory.high (v2), or its
limit hit or OOM counters moved since attach) and `psi>X` (the cgroup's memory PSI `some avg10`,
else the system's, above X percent). Each is read every step of memhook's loop (50 ms): a
snapshot before the OOM killer strikes needs the growth to take longer than that."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..common.format import human_bytes, parse_size

CGROUP_ROOT = "/sys/fs/cgroup"


def _size(text: str) -> int:
    size = parse_size(text)
    if size is None:
        raise ValueError(f"invalid size {text!r} (examples: 512MiB, 2GiB)")
    return size


@dataclass
class Condition:
    text: str           # as given
    kind: str           # rss, heap, pressure, psi
    limit: float = 0.0
    fired: bool = False
    baselines: dict = field(default_factory=dict)  # per PID: the cgroup's counters at first look

    def check(self, session, group: tuple[str, str] | None) -> str:
        """"" while it does not hold for this process (`group`: its memory cgroup, as
        memory_cgroup() found it at attach), else what held ("RSS 2.1 GiB > 2.0 GiB")."""
        pid = session.pid
        if self.kind == "rss":
            rss = _rss(pid)
            return f"RSS {human_bytes(rss)} > {human_bytes(self.limit)}" if rss > self.limit \
                else ""
        if self.kind == "heap":
            out = session.consumer.totals()["outstanding_bytes"]
            return f"outstanding {human_bytes(out)} > {human_bytes(self.limit)}" \
                if out > self.limit else ""
        if self.kind == "psi":
            avg = psi_some_avg10(group)
            return f"memory PSI some avg10 {avg:.2f} > {self.limit:g}" \
                if avg is not None and avg > self.limit else ""
        if group is None:
            return ""
        counters = pressure_counters(group)
        base = self.baselines.setdefault(pid, counters)
        moved = [k for k, v in counters.items() if v > base.get(k, 0)]
        if moved:
            return f"the memory cgroup's {', '.join(moved)} counter(s) moved"
        above = above_soft_limit(group)
        return above


def parse(text: str) -> Condition:
    t = text.strip().lower()
    for kind in ("rss", "heap"):
        if t.startswith(kind + ">"):
            return Condition(text, kind, _size(t[len(kind) + 1:]))
    if t == "pressure":
        return Condition(text, "pressure")
    if t.startswith("psi>"):
        try:
            return Condition(text, "psi", float(t[4:]))
        except ValueError:
            pass
    raise ValueError(f"--snapshot-when {text!r}: expected rss>SIZE, heap>SIZE, pressure or "
                     "psi>PERCENT")


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def memory_cgroup(pid: int) -> tuple[str, str] | None:
    """The process's memory cgroup directory and its version ("v1", "v2"), or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for hid, controllers, path in lines:
        if "memory" in controllers.split(","):
            d = os.path.join(CGROUP_ROOT, "memory", path.lstrip("/"))
            if os.path.isdir(d):
                return d, "v1"
    for hid, controllers, path in lines:
        if hid == "0":
            for root in (CGROUP_ROOT, os.path.join(CGROUP_ROOT, "unified")):
                d = os.path.join(root, path.lstrip("/"))
                if os.path.exists(os.path.join(d, "memory.events")):
                    return d, "v2"
    return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def pressure_counters(group: tuple[str, str]) -> dict:
    """The cgroup's counters that move under memory pressure: v2 memory.events (high, max, oom,
    oom_kill); v1 memory.failcnt (the limit hit) and oom_control's oom_kill."""
    d, version = group
    if version == "v2":
        return {k: int(v) for k, v in (line.split() for line in
                                       _read(os.path.join(d, "memory.events")).splitlines())
                if k in ("high", "max", "oom", "oom_kill") and v.isdigit()}
    out = {}
    failcnt = _number(_read(os.path.join(d, "memory.failcnt")))
    if failcnt is not None:
        out["failcnt"] = failcnt
    for line in _read(os.path.join(d, "memory.oom_control")).splitlines():
        k, _, v = line.partition(" ")
        if k == "oom_kill" and v.strip().isdigit():
            out["oom_kill"] = int(v)
    return out


def above_soft_limit(group: tuple[str, str]) -> str:
    """v2: memory.current above memory.high; v1: usage above memory.soft_limit_in_bytes (when
    one is set below the limit)."""
    d, version = group
    if version == "v2":
        current = _number(_read(os.path.join(d, "memory.current")))
        high = _number(_read(os.path.join(d, "memory.high")))  # ("max": none)
        return f"the memory cgroup is above memory.high ({human_bytes(high)})" \
            if current is not None and high is not None and current > high else ""
    usage = _number(_read(os.path.join(d, "memory.usage_in_bytes")))
    soft = _number(_read(os.path.join(d, "memory.soft_limit_in_bytes")))
    limit = _number(_read(os.path.join(d, "memory.limit_in_bytes")))
    if usage is None or soft is None or limit is None or soft >= limit:
        return ""
    return f"the memory cgroup is above its soft limit ({human_bytes(soft)})" \
        if usage > soft else ""


def oom_kills(group: tuple[str, str] | None) -> int:
    """The cgroup's OOM kills so far (0 where it does not count them)."""
    return pressure_counters(group).get("oom_kill", 0) if group else 0


def psi_some_avg10(group: tuple[str, str] | None) -> float | None:
    """`some avg10` of the cgroup's memory.pressure (v2), else of /proc/pressure/memory."""
    paths = ([os.path.join(group[0], "memory.pressure")] if group and group[1] == "v2" else []) \
        + ["/proc/pressure/memory"]
    for path in paths:
        for line in _read(path).splitlines():
            if line.startswith("some "):
                m = re.search(r"avg10=([\d.]+)", line)
                if m:
                    return float(m.group(1))
    return None
