"""Attach pause and the 16 B full-tracing ratio for a target on each libc (issue 31): this
host's glibc (Debian 12, bookworm), the Debian 11 and 13 roots (scripts/roots.sh; the target
built by the root's own compiler and run under chroot, with a tmpfs on its /dev/shm) and musl
(musl-gcc). benchmarks/targets/
alloc_latency.c in its "pair" mode: batches of 16-byte mallocs alternate between the hooked slot
and copies of malloc/free taken before attach, within each attached session (as alloc_latency.py
--interleaved). The libcs take turns in each cycle, so every one sees the same machine.

    sudo .venv/bin/python benchmarks/libcs.py [--cycles 5] [--count 100000] [--rounds 5]
"""
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from driver import HERE, Session, Target, batch_arguments, spread

ROOTS = Path(os.environ.get("MEMHOOK_ROOTS", "/var/cache/memhook-roots"))
FLAGS = ["-O2", "-g", "-fno-omit-frame-pointer", "-fno-plt"]


def build(name: str, tmp: Path) -> list:
    """The target's argv, built for libc `name`."""
    src = HERE / "targets" / "alloc_latency.c"
    if name == "bookworm (host)":
        subprocess.run(["gcc", *FLAGS, str(src), "-o", str(tmp / "host")], check=True)
        return [str(tmp / "host")]
    if name == "musl":
        subprocess.run(["musl-gcc", *FLAGS, str(src), "-o", str(tmp / "musl")], check=True)
        return [str(tmp / "musl")]
    root = ROOTS / name
    d = Path(tempfile.mkdtemp(prefix="memhook-bench-", dir=root / "opt"))
    os.chmod(d, 0o755)
    shutil.copy(src, d / src.name)
    inside = "/" + str(d.relative_to(root))
    subprocess.run(["chroot", str(root), "gcc", *FLAGS, f"{inside}/{src.name}", "-o",
                    f"{inside}/t"], check=True)
    # (with a tmpfs on its /dev/shm, as container runtimes mount one, in a namespace of its own)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f"mount -t tmpfs -o mode=1777 shm {root}/dev/shm && exec chroot {root} {inside}/t"]


def main():
    ap = batch_arguments(__doc__, cycles=5)
    a = ap.parse_args()
    names = ["bookworm (host)"] + [s for s in ("bullseye", "trixie")
                                   if (ROOTS / s / ".memhook-root").exists()]
    names += ["musl"] if shutil.which("musl-gcc") else []
    tmp = Path(tempfile.mkdtemp())
    targets = {n: Target(*build(n, tmp)) for n in names}
    ratio = {n: [] for n in names}
    ns = {n: [] for n in names}  # (bare, hooked) per cycle
    attach = {n: [] for n in names}
    detach = {n: [] for n in names}
    libc = {}
    for _ in range(a.cycles):
        for n, t in targets.items():
            mh = Session(t.pid)
            libc[n] = mh.attached.split(", ", 1)[1].split(")", 1)[0]
            got = t.answers(f"pair 16 {a.count} {a.rounds} 0")
            mh.stop()
            ratio[n].append(got["ns"] / got["bare"])
            ns[n].append((got["bare"], got["ns"]))
            attach[n].append(mh.attach_ms)
            detach[n].append(mh.detach_ms)
    for t in targets.values():
        assert t.close() == 0
    print(f"{'target':<18} {'libc':<12} {'bare ns':>8} {'hooked ns':>10} "
          f"{'16 B ratio (range)':>20} {'attach ms (range)':>20} {'detach ms':>10}")
    for n in names:
        bare = statistics.median(b for b, _ in ns[n])
        hooked = statistics.median(h for _, h in ns[n])
        print(f"{n:<18} {libc[n]:<12} {bare:>8.1f} {hooked:>10.1f} {spread(ratio[n], 'x'):>20} "
              f"{spread(attach[n], '', 1):>20} {statistics.median(detach[n]):>10.1f}")


if __name__ == "__main__":
    main()
