"""Entry patching's cost (issue 32): the 16 B full-tracing ratio (attached / unprofiled) of
jemalloc's malloc reached through a GOT slot (jemalloc as a shared library) and entry-patched
(jemalloc linked into the executable), measured in turns in one session; the attach pause of
each; events dropped. Trampoline memory is by construction: a 64-byte cell per function, in
one area of whole pages (4 KiB for up to 64). benchmarks/targets/alloc_latency.c, "run" mode
(the unprofiled figure from the same process between sessions: the bare pointers of "pair"
would be the patched function itself).

    sudo .venv/bin/python benchmarks/entry_patch.py [--cycles 7] [-- memhook args, e.g.
                                                     --sample-rate 512KiB]
"""
import subprocess
import tempfile
from pathlib import Path

from driver import HERE, Session, Target, batch_arguments, spread

SRC = HERE / "targets" / "alloc_latency.c"
FLAGS = ["-O2", "-g", "-fno-omit-frame-pointer", "-fno-plt"]
BUILDS = {"GOT slot (libjemalloc.so)": ["-ljemalloc"],
          "entry patch (libjemalloc.a)": ["/usr/lib/x86_64-linux-gnu/libjemalloc.a", "-lm",
                                          "-lpthread", "-ldl"]}


def main():
    ap = batch_arguments(__doc__, cycles=7)
    ap.add_argument("memhook_args", nargs="*")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    targets = {}
    for i, (name, libs) in enumerate(BUILDS.items()):
        exe = tmp / f"t{i}"
        subprocess.run(["gcc", *FLAGS, str(SRC), "-o", str(exe), *libs], check=True)
        targets[name] = Target(str(exe))
    run = f"run 16 {a.count} {a.rounds} 0"
    ratio = {n: [] for n in targets}
    ns = {n: ([], []) for n in targets}  # (unprofiled, attached) ns per call
    attach = {n: [] for n in targets}
    dropped = {n: 0 for n in targets}
    for _ in range(a.cycles):
        for name, t in targets.items():
            bare = t.ask(run, "ns")
            mh = Session(t.pid, *a.memhook_args)
            hooked = t.ask(run, "ns")
            mh.stop()
            dropped[name] += mh.dropped["events"]
            ratio[name].append(hooked / bare)
            ns[name][0].append(bare)
            ns[name][1].append(hooked)
            attach[name].append(mh.attach_ms)
    for t in targets.values():
        assert t.close() == 0
    print(f"{'malloc reached by':<30} {'16 B ratio (range)':>20} {'ns bare':>8} "
          f"{'ns traced':>10} {'attach ms (range)':>20} {'dropped':>9}")
    for name in targets:
        bare, hooked = (sorted(v)[len(v) // 2] for v in ns[name])
        print(f"{name:<30} {spread(ratio[name], 'x'):>20} {bare:>8.1f} {hooked:>10.1f} "
              f"{spread(attach[name], '', 1):>20} {dropped[name]:>9}")
    names = list(targets)
    print("entry / GOT, per cycle: " + spread(
        [e / g for e, g in zip(ratio[names[1]], ratio[names[0]])], "x"))


if __name__ == "__main__":
    main()
