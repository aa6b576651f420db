"""Running the GDB agent against the target: batch mode, no init files, no symbols, no debuginfod,
no libthread_db, so the target is stopped for as short a time as possible."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from importlib import resources

from .procfs import TargetError

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
]


def find_gdb() -> str:
    gdb = shutil.which("gdb")
    if gdb is None:
        raise TargetError("gdb is not installed: install it (Debian/Ubuntu: apt-get install gdb; "
                          "Fedora/RHEL: dnf install gdb)")
    return gdb


def run_agent(params: dict) -> dict:
    """Run the agent with `params`; return what it reported. Raises TargetError on failure."""
    gdb = find_gdb()
    body = resources.files("memhook").joinpath("gdb_agent.py").read_text()
    with tempfile.TemporaryDirectory(prefix="memhook-gdb-") as tmp:  # 0700, root's
        script = os.path.join(tmp, "agent.py")
        with open(script, "w") as f:
            f.write(f"import json\nPARAMS = json.loads({json.dumps(params)!r})\n" + body)
        cmd = [gdb, "-nx", "-nh", "-q", "-batch", "--readnever"]
        for s in GDB_SETTINGS:
            cmd += ["-iex", s]
        cmd += ["-x", script]
        # GDB may be inside a call in the target: neither a terminal's Ctrl-C (own session) nor
        # one aimed at memhook (signals held until GDB is done) may cut it short.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=GDB_TIMEOUT_S, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise TargetError(f"gdb did not finish within {GDB_TIMEOUT_S} s") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if "ptrace" in proc.stderr and ("not permitted" in proc.stderr or "Operation" in proc.stderr):
        raise TargetError("gdb may not trace the target (ptrace: operation not permitted): run as "
                          "root, or relax kernel.yama.ptrace_scope")
    if "Python scripting is not supported" in proc.stderr:
        raise TargetError("this gdb was built without Python support, which memhook needs")
    raise TargetError(f"gdb failed: {detail}")
