"""What the benchmark scripts share: a command-driven target process and memhook sessions."""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(name: str, tmp: Path, *flags: str) -> str:
    exe = tmp / name
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", *flags, "-o", str(exe),
                    str(HERE / "targets" / f"{name}.c"), "-lpthread"], check=True)
    return str(exe)


def batch_arguments(doc: str, cycles: int = 5) -> argparse.ArgumentParser:
    """The options of the benchmarks that time batches of mallocs: --cycles, --count (mallocs
    per round) and --rounds."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=cycles)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    return ap


def alternate(pid: int, cycles: int, memhook_args, keys, measure):
    """Measure every key unprofiled, then with memhook attached, `cycles` times in turn, in the
    same process. Returns per-key lists (bare, attached), the events memhook dropped, and each
    session's output."""
    bare = {k: [] for k in keys}
    hooked = {k: [] for k in keys}
    dropped, outputs = Counter(), []
    for _ in range(cycles):
        for k in keys:
            bare[k].append(measure(k))
        mh = Session(pid, *memhook_args)
        for k in keys:
            hooked[k].append(measure(k))
        outputs.append(mh.stop())
        dropped.update(mh.dropped)  # (+= would drop zeros' keys)
    return bare, hooked, dropped, outputs


def spread(values, unit: str = "", digits: int = 2) -> str:
    """A cycle's figures as the tables print them: the median, then (lowest-highest)."""
    import statistics
    f = f"{{:.{digits}f}}"
    return (f"{f.format(statistics.median(values))}{unit} "
            f"({f.format(min(values))}-{f.format(max(values))})")


def cpu_s(pid: int) -> float:
    """A process's CPU time so far (user and system), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report_of(out: str) -> dict:
    """The JSON report in a session's output (after memhook's own lines), or {}."""
    try:
        return json.loads(out[out.index("{"):out.rindex("}") + 1])
    except ValueError:
        return {}


def print_dropped(dropped: Counter, events: int) -> None:
    n = dropped["events"]
    print(f"dropped events (all cycles): {n} of {events} ({100 * n / events:.1f} %), "
          f"{dropped['frees']} of them frees")
    if dropped["waited_events"]:
        print(f"waited for room in a full ring: {dropped['waited_events']} events, "
              f"{dropped['wait_ns'] / 1e6:.1f} ms in all, {dropped['wait_timeouts']} of them until "
              f"--max-wait ran out (the consumer's pace, in the hooked figures)")


class Target:
    """A target that prints "ready", then answers each command line and ends with "done"."""

    def __init__(self, *argv: str):
        self.p = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1)
        for line in self.p.stdout:  # (a launcher such as heaptrack says its own lines first)
            if line.startswith("ready"):
                return
        raise RuntimeError(f"{argv[0]} ended before it was ready")

    @property
    def pid(self) -> int:
        return self.p.pid

    def ask(self, cmd: str, key: str | None = None) -> float | None:
        """Send `cmd`; the number on its answer line starting with `key`, if any."""
        return self.answers(cmd).get(key)

    def answers(self, cmd: str) -> dict[str, float]:
        """Send `cmd`; its answer lines "KEY NUMBER" as a dict."""
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        values = {}
        for line in self.p.stdout:
            if line.startswith("done"):
                return values
            words = line.split()
            try:
                values[words[0]] = float(words[1])
            except (IndexError, ValueError):
                pass
        raise RuntimeError("target ended")

    def close(self, timeout: float = 10) -> int:
        self.p.stdin.write("exit\n")
        self.p.stdin.flush()
        return self.p.wait(timeout)


# The pauses of tracing's attach and detach (issue 43) are measured without the leak check at
# detach: that is a stop of its own, bounded by --max-pause (benchmarks/leak_check.py).
NO_LEAK_CHECK = ("--no-reachability",)


class Session:
    """`memhook -p PID` from attach (the `attached` line) to SIGINT."""

    def __init__(self, pid: int, *args: str, python: str = sys.executable):
        self.pid = pid
        self.p = subprocess.Popen([python, "-m", "memhook", "-p", str(pid), "--no-live",
                                   "--format", "json", *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd="/")
        self.attached = self.p.stdout.readline()
        if "attached" not in self.attached:
            sys.exit(f"attach failed: {self.attached}{self.p.stderr.read()}")
        self.attach_ms = float(re.search(r"paused ([\d.]+) ms", self.attached).group(1))

    def stop(self) -> str:
        self.p.send_signal(signal.SIGINT)
        out, _ = self.p.communicate(timeout=120)
        m = re.search(r"detached.*paused ([\d.]+) ms", out)
        self.detach_ms = float(m.group(1)) if m else float("nan")
        # Events memhook dropped, and how many of them were frees; and the events whose writer
        # waited for room in a full ring (by default a bounded wait comes before a drop): a
        # hooked figure then includes the consumer's pace.
        self.report = report_of(out)
        totals = self.report.get("totals")
        if totals is None:
            sys.exit(f"memhook -p {self.pid} gave no report: {out[-300:]}")
        self.dropped = Counter({k: totals.get(key, 0) for k, key in (
            ("events", "dropped_events"), ("frees", "dropped_frees"),
            ("waited_events", "waited_events"), ("wait_ns", "wait_ns"),
            ("wait_timeouts", "wait_timeouts"))})
        return out
