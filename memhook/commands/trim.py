"""`memhook trim -p PID`: malloc_trim(0) in the target, through the same GDB agent as attach,
with its resident memory before and after and the heap census's estimate of what it returns.
What operators otherwise do with `gdb -p PID -ex 'call malloc_trim(0)'`, without its risk: the
call runs on a thread that holds no allocator lock, the other threads running meanwhile."""
from __future__ import annotations

from ..common import resident
from ..common.format import human_bytes
from ..common.procfs import TargetError
from ..consumer import heap_census
from ..consumer.session import ENTRY_WAIT_S, check_target
from ..elf import slots as elf
from ..elf import hooks
from ..inject.gdb import GdbWayIn
from ..inject.requests import TrimRequest
from .arguments import EXIT_OK, Parser, pid_arg


def run_trim(argv: list[str]) -> int:
    p = Parser(prog="memhook trim", usage="-p PID", page="docs/resident-memory.md", description="Call malloc_trim(0) in a running process and "
               "show what it gave back.")
    p.add_argument("-p", "--pid", type=pid_arg, required=True, help="the process")
    a = p.parse_args(argv)
    info = check_target(a.pid)
    layout = elf.scan(a.pid, info.exe)
    libc = next(o for o in layout.objects if o.libc)
    trim = libc.defined.get("malloc_trim", 0)
    if layout.libc != "glibc" or not trim:
        raise TargetError(f"PID {a.pid}'s libc ({layout.libc} {layout.libc_version}) has no "
                          "malloc_trim: nothing to call")
    census, _ = heap_census.take(a.pid, layout.libc, layout.libc_version)
    before = resident.totals(a.pid)["Rss"]
    result = GdbWayIn().trim(TrimRequest(
        pid=a.pid, malloc_trim=trim, malloc=layout.real.get(hooks.BY_SYMBOL["malloc"].id, 0),
        entry_wait_s=ENTRY_WAIT_S, libc_text=[(o.lo, o.hi) for o in layout.objects if o.libc],
        loader_text=[(o.lo, o.hi) for o in layout.objects if o.skip == "the dynamic loader"]))
    if "error" in result:
        raise TargetError(result["error"])
    after = resident.totals(a.pid)["Rss"]
    estimate = ("the heap census estimated " + human_bytes(census["trimmable_bytes"])
                if not census.get("problem") else f"no heap census: {census['problem']}")
    print(f"PID {a.pid}: malloc_trim(0) returned {result['result']} "
          f"({'memory released' if result['result'] else 'nothing released'}); resident "
          f"{human_bytes(before)} -> {human_bytes(after)} ({human_bytes(before - after)} "
          f"returned; {estimate}); the target was paused {result['paused_ms']:.1f} ms")
    return EXIT_OK
