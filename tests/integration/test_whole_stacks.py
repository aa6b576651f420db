"""Whole call stacks through code built without frame pointers: for each leak, memhook's frames
equal, return address by return address, gdb's `bt` at a breakpoint on that allocation in the
same binary. Both runs are without address randomisation (gdb's default; `setarch -R` for the
run memhook attaches to), so the two processes put every object at the same address, but for
objects loaded after memhook's own mappings: those are compared by object and link-time
address."""
from __future__ import annotations

import platform
import struct
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from conftest import NO_ASLR, TARGETS, Memhook, Target, run_memhook, traced
from memhook import _native

FRAMELESS = ["-g", "-O2", "-fomit-frame-pointer"]
WITH_FP = ["-g", "-O2", "-fno-omit-frame-pointer"]


# Control-flow protection as hardened distributions build with it: AArch64's pointer
# authentication (return addresses signed on the stack: the walk strips them) and BTI landing
# pads; x86-64's CET (endbr64 pads, shadow-stack notes).
HARDENED = {"aarch64": ["-mbranch-protection=standard"],
            "x86_64": ["-fcf-protection=full"]}[platform.machine()]
# What that puts at a function's entry: paciasp (signs the return address), endbr64.
HARDENED_ENTRY = {"aarch64": (0xd503233f).to_bytes(4, "little"),
                  "x86_64": bytes.fromhex("f30f1efa")}[platform.machine()]


def build_pair(d: Path, lib_flags: list, exe_flags: list = ()) -> Path:
    """tests/targets/frameless.cpp, frameless, linked (lazily bound) against its library built
    with `lib_flags`; and the same library as a plugin to dlopen later."""
    for name in ("libframeless_lib.so", "libframeless_plugin.so"):
        subprocess.run(["g++", *lib_flags, "-shared", "-fPIC", "-Wl,-z,lazy",
                        str(TARGETS / "frameless_lib.cpp"), "-o", str(d / name)],
                       check=True, capture_output=True)
    exe = d / "frameless"
    subprocess.run(["g++", *FRAMELESS, *exe_flags, "-Wl,-z,lazy", "-I", str(TARGETS),
                    str(TARGETS / "frameless.cpp"), "-o", str(exe), f"-L{d}", "-lframeless_lib",
                    "-Wl,-rpath,$ORIGIN", "-ldl", "-lpthread"], check=True, capture_output=True)
    return exe


@pytest.fixture(scope="module", params=["frameless", "mixed", "hardened"])
def frameless(request, tmp_path_factory):
    """The target and its library both frameless, or the library keeping frame pointers, or
    both frameless and built with control-flow protection (HARDENED)."""
    d = tmp_path_factory.mktemp(request.param)
    if request.param == "hardened":
        exe = build_pair(d, FRAMELESS + HARDENED, HARDENED)
        for built in (exe, d / "libframeless_lib.so"):
            assert HARDENED_ENTRY in built.read_bytes(), built  # (the compiler did it)
        return exe
    return build_pair(d, FRAMELESS if request.param == "frameless" else WITH_FP)


WALK = """python
f = gdb.newest_frame()
while f is not None:
    # An inlined call shares its caller's pc; a tail call left no frame on the stack (gdb
    # infers it from the call-site records of debug information).
    if f.type() == gdb.SIGTRAMP_FRAME:
        print("FRAME %#x <signal handler called>" % f.pc())
    elif f.type() not in (gdb.INLINE_FRAME, gdb.TAILCALL_FRAME):
        print("FRAME %#x %s" % (f.pc(), f.name()))
    f = f.older()
# Where each object starts (its mapping at file offset 0), for module-relative addresses.
for line in gdb.execute("info proc mappings", to_string=True).splitlines():
    words = line.split()
    if len(words) >= 5 and words[0].startswith("0x") and int(words[3], 16) == 0 and \
            (words[-1].startswith("/") or words[-1] == "[vdso]"):
        print("BASE %s %s" % (words[0], words[-1]))
end
"""


def gdb_stack(exe: Path, commands: list, stop_at: str, hooked: str, skip: int = 0,
              located: bool = False) -> list:
    """(pc, name) of the callers of `hooked`, as gdb's backtrace has them, at its (skip + 1)-th
    call after `stop_at` starts, the target fed `commands`. A caller's pc is its return
    address; past a signal frame, the interrupted instruction. `located`: each pc as (object,
    link-time address) instead, as memhook's frames give them (module, offset): the same place
    wherever the two runs loaded the object (a library dlopen'ed after attach lies below
    memhook's own mappings)."""
    script = exe.parent / f"commands-{stop_at}-{skip}"
    script.write_text("".join(c + "\n" for c in commands) + "exit\n")
    gdb_script = exe.parent / "walk.gdb"
    gdb_script.write_text(WALK)
    args = ["gdb", "-nx", "-batch",
            "-ex", "set breakpoint pending on",
            "-ex", "handle SIGUSR1 nostop noprint pass",
            "-ex", f"break {stop_at}", "-ex", f"run < {script} > /dev/null",
            "-ex", f"break {hooked}", "-ex", f"ignore 2 {skip}", "-ex", "continue",
            "-x", str(gdb_script), "-ex", "kill", str(exe)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=180).stdout
    frames = [line.split(" ", 2)[1:] for line in out.splitlines() if line.startswith("FRAME ")]
    assert len(frames) > 1, out
    # Frame 0 is the hooked function itself; memhook's stack starts at its caller.
    frames = [(int(pc, 16), name) for pc, name in frames[1:]]
    if not located:
        return frames
    bases = sorted((int(b, 16), path) for b, path in
                   (line.split()[1:3] for line in out.splitlines() if line.startswith("BASE ")))
    out = []
    for pc, name in frames:
        base, path = next(((b, p) for b, p in reversed(bases) if b <= pc), (0, None))
        out.append(((Path(path).name, pc - base + first_load(path)) if path else (None, pc), name))
    return out


def first_load(path: str) -> int:
    """An object's first PT_LOAD's link-time page: a non-PIE executable's 0x400000, else 0."""
    if not path.startswith("/"):
        return 0
    with open(path, "rb") as f:
        return next(s["p_vaddr"] for s in ELFFile(f).iter_segments()
                    if s["p_type"] == "PT_LOAD") & ~0xfff


def memhook_located(report: dict) -> list:
    """memhook_stacks, each frame as (object, link-time address)."""
    return [([(Path(f["module"]).name if f.get("module") else None,
               f["offset"] if f.get("module") else int(f["address"], 16))
              for f in s["frames"] if not f.get("inlined")], names, s)
            for _, names, s in memhook_stacks(report)]


def memhook_stacks(report: dict) -> list:
    """Each site's return addresses (one per real frame: inlined frames share theirs), with
    its names, outstanding bytes and allocation count."""
    out = []
    for s in report["sites"]:
        addrs = [int(f["address"], 16) for f in s["frames"] if not f.get("inlined")]
        names = [f["function"] for f in s["frames"] if not f.get("inlined")]
        out.append((addrs, names, s))
    return out


CASES = [
    # command, where gdb stops first, the hooked function, calls of it to let pass, bytes
    ("strdup 1000", "leak_strdup", "malloc", 0, 1000),
    ("getline", "leak_getline", "malloc", 0, None),
    ("asprintf 3000", "leak_asprintf", "malloc", 0, None),
    ("string 3000", "leak_string", "operator new(unsigned long)", 1, None),  # growth
    ("vector 3000", "leak_vector", "operator new(unsigned long)", 1, None),  # growth
    ("new 5000", "leak_new", "operator new[](unsigned long)", 0, 5000),
    ("lib 777", "lib_step3", "malloc", 0, 777),           # through the library's static helpers
    ("signal 900", "on_usr1", "malloc", 0, 900),          # a handler on a sigaltstack
    ("thread 1100", "leak_in_thread", "malloc", 0, 1100),  # a new thread's first event
]


@pytest.mark.arm64
def test_leaks_have_gdbs_stack(tmp_path, frameless):
    exe = frameless
    target = Target(exe, argv=[*NO_ASLR, str(exe)])
    try:
        mh = Memhook(target.pid, tmp_path)
        for command, *_ in CASES:
            target.command(command)
        # A library loaded after attach: its rows are published once the dlopen hook counts
        # it; memhook looks every 50 ms.
        target.command(f"dlopen {exe.parent / 'libframeless_plugin.so'}")
        time.sleep(1.0)
        target.command("plugin 555")
        report = mh.stop()
        assert target.finish() == 0
    finally:
        target.kill()
    stacks = memhook_located(report)
    cases = CASES + [("plugin 555", "lib_step3", "malloc", 0, 555)]
    for command, stop_at, hooked, skip, size in cases:
        commands = [command] if command != "plugin 555" else [
            f"dlopen {exe.parent / 'libframeless_plugin.so'}", command]
        want = gdb_stack(exe, commands, stop_at, hooked, skip, located=True)
        want_addrs = [a for a, _ in want]
        names = [n for _, n in want]
        assert len(want) >= 12, (command, names)  # eight chain frames and more
        found = [(a, n, s) for a, n, s in stacks if a == want_addrs]
        near = [n for a, n, s in stacks if a and a[0] == want_addrs[0]]
        assert found, f"{command}: gdb says {names}; memhook has {near}"
        if size is not None:
            assert any(s["outstanding_bytes"] == size and s["alloc_count"] == 1
                       for _, _, s in found), (command, [s for _, _, s in found])
        # Where gdb names the frame as the report must (the trampoline of a stripped libc, and
        # main), the names agree too.
        for _, have, _ in found:
            for i, name in enumerate(names):
                if name in ("main", "<signal handler called>"):
                    assert have[i] == name, (command, names, have)
        assert names[-1] == "main" or command.startswith("thread"), (command, names)
    # The text report names the trampoline as gdb does, between the handler and the code the
    # signal interrupted, not as an address in libc.
    text = run_memhook("report", mh.capture).stdout
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "<signal handler called>" in line)
    assert "leak_strdup" in lines[at - 1] and "raise" in "".join(lines[at + 1:at + 3]), text
    assert "+0x" not in lines[at], lines[at]


@pytest.mark.parametrize("pie", [True, False])
def test_main_found_in_stripped_executable(tmp_path, pie):
    """The walk ends at main (as gdb's bt does); in a stripped executable memhook finds main
    from the entry point's call to __libc_start_main, PIE (lea) or not (mov $main)."""
    exe = tmp_path / "t"
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-x", "c", "-", "-o", str(exe),
                    "-pie" if pie else "-no-pie"],
                   input="#include <stdlib.h>\nint main(){return malloc(1)!=0;}\n", text=True,
                   check=True)
    nm = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    want = next(int(line.split()[0], 16) for line in nm.splitlines() if line.endswith(" T main"))
    subprocess.run(["strip", str(exe)], check=True)
    assert "main" not in subprocess.run(["nm", "-D", str(exe)], capture_output=True,
                                        text=True).stdout.split()
    rows, info = _native.cfi_rows(str(exe))
    assert info["main"] == want
    # main's rows carry the `last` bit (unwind_rows.h).
    marked = [start for start, r in struct.iter_unpack("<II", rows) if r & _native.ROW_LAST]
    assert marked and marked[0] == want


def test_library_loaded_without_the_dlopen_hook(tmp_path):
    """A library loaded by dlmopen (as glibc loads NSS and iconv modules: no dlopen hook sees
    it) gets its rows from memhook's periodic look at the maps: a leak in it a few seconds
    later has its whole stack."""
    exe = build_pair(tmp_path, FRAMELESS)
    target = Target(exe)
    try:
        mh = Memhook(target.pid, tmp_path)
        target.command(f"dlmopen {exe.parent / 'libframeless_plugin.so'}")
        time.sleep(4.0)  # memhook reads the maps every 2 s
        target.command("plugin 557")
        report = mh.stop()
        assert target.finish() == 0
    finally:
        target.kill()
    leak = next(s for s in report["sites"] if s["outstanding_bytes"] == 557)
    names = [f["function"] or "" for f in leak["frames"] if not f.get("inlined")]
    assert [n.split("(")[0] for n in names[1:5]] == [
        "lib_step3", "lib_step2", "lib_step1", "lib_leak_strdup"], names
    assert names[-1] == "main" and "[no unwind info]" not in names, names


def random_rows(rng, lo: int, hi: int, n: int) -> bytes:
    """n rows over link-time addresses [lo, hi): sorted starts, any rule at all (kinds memhook
    never writes, CFA offsets up to 512 KiB, rbp slots anywhere, the `last` bit)."""
    starts = sorted(rng.randrange(lo, max(hi, lo + 1)) for _ in range(n))
    out = bytearray()
    for s in starts:
        kind = rng.randrange(8)
        cfa = rng.choice([rng.randrange(4), rng.randrange(64), rng.randrange(1 << 16)])
        slot = rng.choice([rng.randrange(4), rng.randrange(1 << 10)])
        r = kind | rng.randrange(4) << 3 | slot << 5 | (rng.random() < 0.02) << 15 | cfa << 16
        out += struct.pack("<II", s & 0xFFFFFFFF, r)
    return bytes(out)


def test_random_rows_never_harm_the_target(tmp_path):
    """Tables replaced by random rows (wrong rules, rules on the wrong code, overlapping
    objects, rows in no order): the target runs its whole workload, every leak kind and a
    signal handler on an alternate stack, and ends normally; real rows published again give
    whole stacks again."""
    import random
    from memhook.consumer.session import Options, Session
    from memhook.unwind.tables import row_span
    exe = build_pair(tmp_path, FRAMELESS)
    target = Target(exe)
    session = Session(target.pid, Options())
    session.attach()
    rng = random.Random(1834)
    workload = ["strdup 100", "getline", "asprintf 300", "string 300", "vector 300", "new 50",
                "lib 70", "signal 90"]
    try:
        objects = list(session.unwind.objects.values())
        for round_ in range(12):
            index = []
            for m, r in objects:
                if len(r.rows) < 16:
                    continue
                lo, hi = row_span(r.rows)
                if round_ % 3 == 0:    # random rules over the object's code
                    rows = random_rows(rng, lo, hi, 1500)
                elif round_ % 3 == 1:  # its real rules, each on some other row's code
                    real = list(struct.iter_unpack("<II", r.rows))
                    rules = [x for _, x in real]
                    rng.shuffle(rules)
                    rows = b"".join(struct.pack("<II", s, x) for (s, _), x in zip(real, rules))
                else:                  # rows in no order at all
                    rows = bytes(rng.randrange(256) for _ in range(8 * 1500))
                first = session.consumer.unwind_add_rows(rows)
                shift = rng.choice([0, 0, rng.randrange(-1 << 16, 1 << 16) & ~7])
                index.append((m.bias + lo + shift, m.bias + hi + shift + rng.randrange(1 << 20),
                              m.bias + shift, first, len(rows) // 8))
            session.consumer.unwind_publish(index)
            for command in workload * 5:
                target.command(command)
        # The random rows were walked, each round's anew (a new index empties the recent
        # stacks): stacks cut short by them, or led astray.
        time.sleep(0.5)
        offsets, frames = session.consumer.stacks()
        markers = {_native.FRAME_NO_UNWIND_INFO, _native.FRAME_UNWIND_STOPPED}
        cut = sum(int(f) in markers for f in frames)
        assert cut > 20 and len(offsets) > 50, (cut, len(offsets))
        # The real rows again, and a library loaded after them: its leak has its whole stack.
        session.unwind.publish(session.consumer, session.modules)
        target.command(f"dlopen {exe.parent / 'libframeless_plugin.so'}")
        session.poll_loads(rescan=True)
        target.command("plugin 555")
        deadline = time.time() + 10
        while time.time() < deadline:
            out = session.consumer.sites()["outstanding_bytes"]
            if 555 in out:
                break
            time.sleep(0.1)
        offsets, frames = session.consumer.stacks()
        stack = int(list(out).index(555))
        walked = [int(f) for f in frames[offsets[stack] - offsets[0]:offsets[stack + 1] - offsets[0]]]
    finally:
        session.detach("test")
    assert target.finish() == 0
    assert len(walked) >= 12 and not set(walked) & markers, walked


def test_code_without_rows(tmp_path, targets):
    """Code without rows gets one guarded frame-pointer step per frame: JIT code (anonymous
    executable memory) that keeps a frame pointer leads on to the whole stack, and JIT code that
    does not ends it with [no unwind info]. So do libraries loaded and run at once, before
    memhook has published their rows: one built with frame pointers has its whole stack at
    once, a frameless one (whose rbp holds data) a stack cut off with [no unwind info]."""
    exe = build_pair(tmp_path, FRAMELESS)
    (tmp_path / "fp").mkdir()
    with_fp = build_pair(tmp_path / "fp", WITH_FP).parent / "libframeless_plugin.so"
    mh, report = traced(targets(exe), tmp_path, "jit 4321", "jitbare 4322",
                       f"dlleak {exe.parent / 'libframeless_plugin.so'} 4323",
                       f"dlleak {with_fp} 4324")
    by_size = {s["outstanding_bytes"]: [f for f in s["frames"] if not f.get("inlined")]
               for s in report["sites"]}
    jit = by_size[4321]
    names = [f["function"] for f in jit]
    assert names[0].startswith("jit_alloc") and jit[1]["module"] is None, jit[:3]
    assert names[2].startswith("leak_jit") and names[-1] == "main", names
    assert "[no unwind info]" not in names
    bare = [f["function"] for f in by_size[4322]]
    assert bare[0].startswith("jit_alloc") and bare[2:] == ["[no unwind info]"], by_size[4322]
    late = [f["function"] for f in by_size[4323]]
    assert late[-1] == "[no unwind info]" and late[-2].startswith("lib_step3"), late
    late_fp = [f["function"] for f in by_size[4324]]
    assert [n.split("(")[0] for n in late_fp[1:6]] == [
        "lib_step3", "lib_step2", "lib_step1", "lib_leak_strdup", "leak_plugin"], late_fp
    assert late_fp[-1] == "main" and "[no unwind info]" not in late_fp, late_fp
    text = run_memhook("report", mh.capture).stdout
    stacks = text[text.index("call stacks by outstanding bytes"):].split("\n#")
    late_block = next(b for b in stacks if " 4323 bytes in 1 blocks" in b.splitlines()[0])
    assert late_block.splitlines()[-1].strip() == "[no unwind info]", late_block


DEBIAN_PYTHON = Path("/usr/bin/python3.11")
KEEPER = """
import sys
keep = []
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "exit":
        break
    keep += [bytearray(5000) for _ in range(int(line))]
    print("done", flush=True)
"""


@pytest.mark.skipif(not DEBIAN_PYTHON.exists(), reason="Debian's python3.11 is not installed")
def test_debian_python_bytearray_leak(tmp_path, targets):
    """The case that opened the issue: Debian's python3.11 (built -O3 without frame pointers)
    keeping bytearray(5000) objects. The leak's stack runs from the allocator through
    PyByteArray_Resize, the type call and the interpreter loop (named as the Python code it ran:
    the list comprehension and the module) down to Py_BytesMain and libc's start (python's
    main tail-calls Py_BytesMain), not two frames in obmalloc.c."""
    script = tmp_path / "keeper.py"
    script.write_text(KEEPER)
    _, report = traced(targets(script, argv=[str(DEBIAN_PYTHON), str(script)]), tmp_path,
                       "1000")
    big = max(report["sites"], key=lambda s: s["outstanding_bytes"])
    assert big["outstanding_bytes"] >= 1000 * 5000
    names = [f["function"] or "" for f in big["frames"] if not f.get("inlined")]
    want = ["PyByteArray_Resize", "_PyObject_MakeTpCall", "<listcomp>", "<module>",
            "PyEval_EvalCode", "Py_RunMain", "Py_BytesMain", "_start"]
    assert [n for n in names if n in want] == want, names
    assert len(names) >= 14 and names[-1] == "_start", names


@pytest.mark.arm64
@pytest.mark.parametrize("how", ["no tables", "no search table", "no tables, no frame pointers"])
def test_library_without_call_frame_information(tmp_path, how, targets):
    """Code no CFI covers: functions of a library built without unwind tables beside one built
    with them (gaps between its FDEs), or the same library linked without .eh_frame_hdr
    (memhook enumerates its FDEs from .eh_frame itself: tests/unit/test_native.py). Its
    frames keep frame pointers and are walked to the whole stack by rows derived from their
    prologues (or, before those, frame-pointer steps); without frame pointers, by those rows
    alone."""
    lib = tmp_path / "libnocfi.so"
    frame_pointers = "-fomit-frame-pointer" if "no frame pointers" in how else \
        "-fno-omit-frame-pointer"
    subprocess.run(["gcc", "-O2", frame_pointers, "-fno-asynchronous-unwind-tables",
                    "-fno-unwind-tables", "-c", "-fPIC", "-x", "c", "-", "-o",
                    str(lib.with_suffix(".o"))],
                   input="#include <stdlib.h>\n#include <string.h>\n"
                         "__attribute__((noinline)) static char* inner(int n) {\n"
                         "  char* p = malloc(n); memset(p, 1, n); return p; }\n"
                         "char* nocfi_leak(int n) { char* p = inner(n); p[0]++; return p; }\n",
                   text=True, check=True)
    subprocess.run(["gcc", "-O2", "-c", "-fPIC", "-x", "c", "-", "-o", str(tmp_path / "cfi.o")],
                   input="int with_cfi(int x) { return x + 1; }\n", text=True, check=True)
    subprocess.run(["gcc", "-shared", str(lib.with_suffix(".o")), str(tmp_path / "cfi.o"),
                    "-o", str(lib),
                    *(["-Wl,--no-eh-frame-hdr"] if how == "no search table" else [])], check=True)
    exe = tmp_path / "uses_nocfi"
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-I", str(TARGETS), "-x", "c", "-",
                    "-o", str(exe), f"-L{tmp_path}", "-lnocfi", "-Wl,-rpath,$ORIGIN"],
                   input='#include "harness.h"\nchar* nocfi_leak(int n);\n'
                         "char* kept[64]; int k;\n"
                         "__attribute__((noinline)) static void caller(int n) {\n"
                         "  kept[k % 64] = nocfi_leak(n); k++; }\n"
                         "int main(void) { char cmd[64]; harness_ready();\n"
                         "  while (harness_next(cmd, sizeof cmd)) { caller(atoi(cmd));"
                         " harness_done(); } return 0; }\n",
                   text=True, check=True)
    _, report = traced(targets(exe), tmp_path, "6543")
    leak = next(s for s in report["sites"] if s["outstanding_bytes"] == 6543)
    names = [f["function"] for f in leak["frames"] if not f.get("inlined")]
    assert names == ["inner", "nocfi_leak", "caller", "main"], names
    assert not report.get("modules_without_unwind_rows"), report["modules_without_unwind_rows"]
    if how != "no search table":
        assert [f.get("unwound") for f in leak["frames"][:2]] == ["derived rows"] * 2, \
            leak["frames"][:2]


@pytest.mark.arm64
@pytest.mark.parametrize("flags", [FRAMELESS, WITH_FP], ids=["frameless", "frame pointers"])
def test_a_wrappers_callers_taking_turns(tmp_path, targets, flags):
    """Six callers of one wrapper at one depth share a recent stack's key (the wrapper's return
    address and stack pointer): a set of entries holds four of them, the others are walked and
    kept in turn. Every block is still its own caller's, exactly, in the order they came."""
    from conftest import build
    rounds = 3000
    exe = build(tmp_path, "wrapper_callers.c", base_flags=flags)
    _, report = traced(targets(exe), tmp_path, f"go {rounds}")
    by_caller = {}
    for s in report["sites"]:
        names = [f["function"] for f in s["frames"]]
        if names[:1] == ["xmalloc"]:
            assert names[1].startswith("caller") and names[2:4] == ["run", "main"], names
            by_caller[names[1]] = (s["outstanding_count"], s["outstanding_bytes"])
    assert by_caller == {f"caller{k}": (rounds, rounds * (100 + k)) for k in range(6)}, by_caller
