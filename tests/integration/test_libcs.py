"""Targets on other libcs, as containers run them (issue 31). Debian 11 (glibc 2.31) and Debian
13 (2.41) root file systems (scripts/roots.sh), each target compiled inside its root by the root's
own compiler and run there, once under chroot (the host sees its files by their host paths) and
once in a mount namespace whose root is that directory (unshare -m, pivot_root: the target's
/proc/PID/maps names the container's paths, as a container runtime's processes do). And musl
(Alpine's libc): targets built with musl-gcc."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from conftest import (NO_ASLR, TARGETS, Memhook, Target, assert_restored, run_memhook, site,
                      slot_values)
from test_safety import forks_while_attached, killed_once_attached
from test_whole_stacks import CASES, FRAMELESS, WALK, gdb_stack, memhook_stacks

from memhook.common import arch

ROOTS = Path(os.environ.get("MEMHOOK_ROOTS", "/var/cache/memhook-roots"))
SUITES = {"bullseye": "glibc 2.31", "trixie": "glibc 2.41"}
WAYS = ["chroot", "namespace"]

# In a new mount namespace: the root directory bound onto itself and made the namespace's root
# with pivot_root, the host's tree detached, /proc mounted (as a container runtime does); the
# directories named after the root made noexec first, a tmpfs on /dev/shm.
# $1 = root, $2 = noexec dirs, then argv.
ENTER = r"""set -e
root=$1; noexec=$2; shift 2
mount --bind "$root" "$root"
for d in $noexec; do mount --bind "$root$d" "$root$d"; mount -o remount,bind,noexec "$root$d"; done
cd "$root"
# (a directory of its own for the old root: several tests enter one root at once, and one's rmdir
# would take the others' mount point away)
old=$(mktemp -d "$root/.host-XXXXXXXX"); old=${old#"$root"}
pivot_root . ".$old"
mount -t proc proc /proc
mount -t tmpfs -o mode=1777 shm /dev/shm
umount -l "$old"
rmdir "$old"
exec "$@"
"""
# chroot with some directories noexec: a mount namespace of its own for those mounts only.
CHROOT_NOEXEC = r"""set -e
root=$1; noexec=$2; shift 2
for d in $noexec; do mount --bind "$root$d" "$root$d"; mount -o remount,bind,noexec "$root$d"; done
exec chroot "$root" "$@"
"""


class Place:
    """One root, entered one way: builds targets inside it and starts them there."""

    def __init__(self, suite: str, way: str):
        self.suite, self.way = suite, way
        self.root = ROOTS / suite
        self.libc = SUITES[suite]
        self.dirs: list = []

    def workdir(self) -> Path:
        """A fresh directory in the root, outside /tmp (which a test makes noexec)."""
        (self.root / "opt").mkdir(exist_ok=True)
        d = Path(tempfile.mkdtemp(prefix="memhook-test-", dir=self.root / "opt"))
        os.chmod(d, 0o755)
        self.dirs.append(d)
        return d

    def inside(self, host_path: Path) -> str:
        return "/" + str(host_path.relative_to(self.root))

    def sh(self, d: Path, cmd: str) -> None:
        """`cmd` run in the root, in directory `d`."""
        subprocess.run(["chroot", str(self.root), "sh", "-c", f"cd {self.inside(d)} && {cmd}"],
                       check=True, capture_output=True, timeout=300)

    def build(self, source: str, *, flags: str = "-g -O0 -fno-omit-frame-pointer",
              libs: str = "-lpthread -ldl") -> Path:
        d = self.workdir()
        for f in ("harness.h", source):
            shutil.copy(TARGETS / f, d / f)
        compiler = "g++" if source.endswith(".cpp") else "gcc"
        out = Path(source).stem
        self.sh(d, f"{compiler} {flags} -I. {source} -o {out} {libs}")
        return d / out

    def seen(self, host_path: Path) -> str:
        """The path the target's /proc/PID/maps shows for a file of the root."""
        return self.inside(host_path) if self.way == "namespace" else str(host_path)

    def argv(self, *command, noexec: str = "") -> list:
        command = [str(c) for c in command]
        if self.way == "namespace":
            return ["unshare", "--mount", "--propagation", "private", "sh", "-c", ENTER, "sh",
                    str(self.root), noexec, *command]
        if noexec:
            return ["unshare", "--mount", "--propagation", "private", "sh", "-c", CHROOT_NOEXEC,
                    "sh", str(self.root), noexec, *command]
        return ["chroot", str(self.root), *command]

    def start(self, exe: Path, *args, noexec: str = "", prefix=()) -> Target:
        return Target(exe, argv=self.argv(*prefix, self.inside(exe), *args, noexec=noexec))

    def cleanup(self) -> None:
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=[(s, w) for s in SUITES for w in WAYS], ids=lambda p: f"{p[0]}-{p[1]}")
def place(request):
    suite, way = request.param
    if not (ROOTS / suite / ".memhook-root").exists():
        message = f"no {suite} root in {ROOTS}: scripts/roots.sh builds it"
        if os.environ.get("MEMHOOK_REQUIRE_ROOTS") == "1":  # scripts/test.sh built them
            pytest.fail(message)
        pytest.skip(message)
    p = Place(suite, way)
    targets: list = []
    p.started = targets
    yield p
    for t in targets:
        t.kill()
    p.cleanup()


def started(place: Place, *a, **kw) -> Target:
    t = place.start(*a, **kw)
    place.started.append(t)
    return t


def maps_paths(pid: int, name: str) -> list:
    return [line.split(maxsplit=5)[5].strip() for line in open(f"/proc/{pid}/maps")
            if name in line]


def test_exact_bytes_named_frames_and_a_library_loaded_later(tmp_path, place):
    """Exact bytes for the executable's leak and for a C++ plugin dlopen'ed after attach; every
    frame named from the root's own files (in a namespace: from the copies memhook kept by
    build-id); the report names the root's glibc."""
    exe = place.build("lifecycle.c")
    d = exe.parent
    shutil.copy(TARGETS / "plugin.cpp", d / "plugin.cpp")
    place.sh(d, "g++ -shared -fPIC -g -O0 -fno-omit-frame-pointer plugin.cpp -o libplugin.so")
    target = started(place, exe, place.inside(d / "libplugin.so"))
    libc = maps_paths(target.pid, "libc")
    # What each way shows the host: the root's files by host path, or the container's paths.
    if place.way == "chroot":
        assert libc and all(p.startswith(str(place.root)) for p in libc), libc
    else:
        assert libc and not any(p.startswith(str(place.root)) for p in libc), libc
    mh = Memhook(target.pid, tmp_path)
    assert f", {place.libc}): " in mh.attached_line, mh.attached_line
    target.command("go")
    target.command("load")
    report = mh.stop()
    # A plain chroot has no /dev/shm of its own: memhook says what that costs.
    assert ("/dev/shm is not a tmpfs" in mh.stderr) == (place.way == "chroot"), mh.stderr
    assert report["libc"] == place.libc
    leak = site(report, "late_leak")
    assert (leak["outstanding_bytes"], leak["outstanding_count"]) == (7 * 99, 7)
    assert [f["function"] for f in leak["frames"]][:2] == ["late_leak", "main"], leak["frames"]
    assert leak["frames"][0]["file"].endswith("lifecycle.c")
    assert site(report, "plugin_leak_new")["outstanding_bytes"] == 8 * 777
    assert site(report, "plugin_leak_malloc")["outstanding_bytes"] == 12 * 555
    assert site(report, "plugin_leak_table")["outstanding_bytes"] == 5 * 333
    assert report["totals"]["outstanding_bytes"] == 7 * 99 + 8 * 777 + 12 * 555 + 5 * 333
    target.command("go")  # it keeps working after detach
    assert target.finish() == 0
    # Offline, the target gone: a namespace's files are found by build-id where memhook kept them.
    text = run_memhook("report", mh.capture).stdout
    assert f"), {place.libc}, " in text.splitlines()[0], text.splitlines()[0]
    assert "not symbolized" not in text and "late_leak" in text, text


def root_gdb_stack(place: Place, exe: Path, commands: list, stop_at: str, hooked: str,
                   skip: int) -> list:
    """test_whole_stacks.gdb_stack, with the root's own gdb running the root's program."""
    d = exe.parent
    script = d / f"commands-{stop_at}-{skip}"
    script.write_text("".join(c + "\n" for c in commands) + "exit\n")
    (d / "walk.gdb").write_text(WALK)
    # (in a namespace of its own whatever the place: gdb needs the root to have /proc)
    args = Place(place.suite, "namespace").argv("gdb", "-nx", "-batch",
            "-ex", "set breakpoint pending on",
            "-ex", "handle SIGUSR1 nostop noprint pass",
            "-ex", f"break {stop_at}", "-ex", f"run < {place.inside(script)} > /dev/null",
            "-ex", f"break {hooked}", "-ex", f"ignore 2 {skip}", "-ex", "continue",
            "-x", place.inside(d / "walk.gdb"), "-ex", "kill", place.inside(exe))
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180)
    out = proc.stdout
    frames = [line.split(" ", 2)[1:] for line in out.splitlines() if line.startswith("FRAME ")]
    assert len(frames) > 1, (proc.returncode, out, proc.stderr[-2000:])
    return [(int(pc, 16), name) for pc, name in frames[1:]]


STACK_CASES = [c for c in CASES if c[0].split()[0] in ("strdup", "string", "lib", "signal",
                                                          "thread")]


def test_frameless_stacks_equal_the_roots_gdb(tmp_path, place):
    """Frameless code (the root's compiler, -O2 -fomit-frame-pointer) through the root's glibc
    and libstdc++: memhook's stacks equal, return address by return address, those the root's
    own gdb prints, both runs without address randomisation."""
    d = place.workdir()
    for f in ("harness.h", "frameless.cpp", "frameless_lib.cpp"):
        shutil.copy(TARGETS / f, d / f)
    exe = d / "frameless"
    place.sh(d, f"g++ {' '.join(FRAMELESS)} -shared -fPIC -Wl,-z,lazy frameless_lib.cpp "
                "-o libframeless_lib.so && "
                f"g++ {' '.join(FRAMELESS)} -Wl,-z,lazy -I. frameless.cpp -o frameless "
                f"-L. -lframeless_lib -Wl,-rpath,{place.inside(d)} -ldl -lpthread")
    target = started(place, exe, prefix=NO_ASLR)
    mh = Memhook(target.pid, tmp_path)
    for command, *_ in STACK_CASES:
        target.command(command)
    report = mh.stop()
    assert target.finish() == 0
    stacks = memhook_stacks(report)
    for command, stop_at, hooked, skip, size in STACK_CASES:
        want = root_gdb_stack(place, exe, [command], stop_at, hooked, skip)
        addrs = [a for a, _ in want]
        names = [n for _, n in want]
        assert len(want) >= 12 and (names[-1] == "main" or command.startswith("thread")), \
            (command, names)
        found = [s for a, _, s in stacks if a == addrs]
        near = [n for a, n, _ in stacks if a and a[0] == addrs[0]]
        assert found, f"{command}: the root's gdb says {names}; memhook has {near}"
        if size is not None:
            assert any(s["outstanding_bytes"] == size for s in found), (command, found)


def test_fork_then_kill_9_then_attach_again(tmp_path, place):
    """Children forked while attached run, the parent stays exact; memhook killed -9, the
    target unhooks itself at its next allocations, and a new memhook attaches exactly."""
    exe = place.build("lifecycle.c")
    target = started(place, exe, "/nonexistent.so")
    forks_while_attached(target, tmp_path)
    _, before = slot_values(target.pid, place.seen(exe))
    killed_once_attached(target.pid, "1")
    target.command("go")
    time.sleep(1.5)
    target.command("churn")  # the hooks notice the silence and unhook
    assert_restored(target.pid, place.seen(exe), before)
    again = Memhook(target.pid, tmp_path)
    target.command("go")
    report = again.stop()
    assert report["totals"]["unknown_free_count"] == 0
    assert site(report, "late_leak")["outstanding_bytes"] == 7 * 99
    assert_restored(target.pid, place.seen(exe), before)
    assert target.finish() == 0


def test_noexec_tmp_inside_the_root(tmp_path, place):
    """The root's /tmp mounted noexec: the hook library goes to the root's /var/tmp (a place
    the target sees), and memhook is exact."""
    exe = place.build("lifecycle.c")
    target = started(place, exe, "/nonexistent.so", noexec="/tmp")
    mh = Memhook(target.pid, tmp_path)
    library = maps_paths(target.pid, "libmemhook_hook")
    inside = "/var/tmp/memhook-" if place.way == "namespace" else f"{place.root}/var/tmp/memhook-"
    assert library and all(p.startswith(inside) for p in library), library
    target.command("go")
    assert site(mh.stop(), "late_leak")["outstanding_bytes"] == 7 * 99
    assert target.finish() == 0


# musl (Alpine's libc): targets built with musl-gcc (musl-tools), run on the host.
MUSL_PLUGIN = """#include <stdlib.h>
#include <string.h>
void* plugin_kept[16];
int plugin_n;
__attribute__((noinline)) static void plugin_inner(int n) {
  plugin_kept[plugin_n++ % 16] = memset(malloc(n), 1, n);
}
void plugin_leak(int n) { plugin_inner(n); }
"""


@pytest.fixture(scope="module")
def musl_target(tmp_path_factory):
    """tests/targets/libc_calls.c and a plugin, built with musl-gcc, dynamically linked."""
    if shutil.which("musl-gcc") is None:
        message = "musl-gcc is not installed (scripts/setup.sh installs musl-tools)"
        if os.environ.get("MEMHOOK_REQUIRE_ROOTS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    d = tmp_path_factory.mktemp("musl")
    exe = d / "libc_calls"
    subprocess.run(["musl-gcc", "-g", "-O0", "-fno-omit-frame-pointer", "-I", str(TARGETS),
                    str(TARGETS / "libc_calls.c"), "-o", str(exe)], check=True)
    (d / "plugin.c").write_text(MUSL_PLUGIN)
    subprocess.run(["musl-gcc", "-g", "-O2", "-shared", "-fPIC", str(d / "plugin.c"), "-o",
                    str(d / "libplugin.so")], check=True)
    interp = subprocess.run(["readelf", "-l", str(exe)], capture_output=True, text=True).stdout
    assert "ld-musl" in interp, interp
    return exe


def musl_version() -> str:
    out = subprocess.run([f"/lib/ld-musl-{platform.machine()}.so.1"], capture_output=True,
                         text=True).stderr
    return next(line.split()[1] for line in out.splitlines() if line.startswith("Version"))


def musl_libc_maps(pid: int) -> list:
    """The (start, end, permissions) of musl's libc in the target's maps."""
    return [tuple(line.split()[:2]) for line in open(f"/proc/{pid}/maps")
            if "ld-musl" in line or line.rstrip().endswith("/libc.so")]


def assert_each_call_exact(report: dict) -> None:
    """libc_calls.c's "each": every call's bytes at its own site, stacks [function, main], and
    no site inside the C library's allocating functions (musl's calloc calls malloc)."""
    want = {"leak_malloc": (1001, ["malloc"]), "leak_calloc": (999, ["calloc"]),
            "leak_realloc": (2002, ["realloc"]), "leak_memalign": (3003, ["posix_memalign"])}
    for function, (size, operations) in want.items():
        sites = [s for s in report["sites"] if s["frames"][0]["function"] == function
                 and s["operations"] == operations]
        assert len(sites) == 1, (function, report["sites"])
        s = sites[0]
        assert (s["outstanding_bytes"], s["outstanding_count"], s["alloc_count"]) == (size, 1, 1)
        assert [f["function"] for f in s["frames"]] == [function, "main"], s["frames"]
    first = {s["frames"][0]["function"] for s in report["sites"]}
    assert first - {"strdup", "__strdup"} == {*want, "churn"}, first
    strdup = [s for s in report["sites"] if s["frames"][0]["function"] in ("strdup", "__strdup")
              or s["frames"][0]["function"] == "leak_strdup"]
    assert sum(s["outstanding_bytes"] for s in strdup) == 4004, strdup
    churn = site(report, "churn")
    assert (churn["alloc_count"], churn["free_count"], churn["outstanding_bytes"]) == (100, 100, 0)
    t = report["totals"]
    assert t["outstanding_bytes"] == 1001 + 999 + 2002 + 3003 + 4004
    assert t["alloc_count"] == 5 + 1 + 100  # leak_realloc's malloc(10) too
    assert t["unknown_free_count"] == 0 and t["dropped_events"] == 0


def test_no_libdl_every_call_exact(tmp_path, place):
    """A program that never calls dlopen: before glibc 2.34 it loads no libdl, and memhook loads
    its library through libc's own __libc_dlopen_mode. Every allocating call exact."""
    exe = place.build("libc_calls.c", flags="-g -O0 -fno-omit-frame-pointer -DNO_DL", libs="")
    needed = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout
    assert "libdl" not in needed, needed
    target = started(place, exe)
    assert not [line for line in open(f"/proc/{target.pid}/maps") if "libdl" in line]
    mh = Memhook(target.pid, tmp_path)  # (its library then loads libdl, which it names)
    target.command("each")
    report = mh.stop()
    assert_each_call_exact(report)
    assert target.finish() == 0


@pytest.mark.arm64
def test_musl_every_call_exact_and_whole_stacks(tmp_path, musl_target, targets):
    """malloc, calloc, realloc, posix_memalign, strdup and free in a musl target: exact bytes;
    stacks equal gdb's bt, return address by return address; strdup's stack goes through
    musl's libc, which has no call-frame information for it, by rows derived from its machine
    code, and the report says so in one line."""
    target = targets(musl_target, argv=[*NO_ASLR, str(musl_target)])
    before = musl_libc_maps(target.pid)
    mh = Memhook(target.pid, tmp_path)
    assert f", musl {musl_version()}): " in mh.attached_line, mh.attached_line
    # musl's loader leaves its own RELRO writable on AArch64 (and its malloc uses the rest of
    # that page): patching its slots leaves each of its pages as writable as it was.
    assert musl_libc_maps(target.pid) == before
    target.command("each")
    report = mh.stop()
    assert target.finish() == 0
    assert report["libc"] == f"musl {musl_version()}"
    assert_each_call_exact(report)
    strdup = site(report, "strdup")
    assert strdup["frames"][0]["module"].endswith("libc.so"), strdup
    assert strdup["frames"][0]["unwound"] == "derived rows", strdup  # (no CFI)
    assert [f["function"] for f in strdup["frames"][1:]] == ["leak_strdup", "main"], strdup
    stacks = memhook_stacks(report)
    for function, hooked in (("leak_malloc", "malloc"), ("leak_memalign", "posix_memalign")):
        want = gdb_stack(musl_target, ["each"], function, hooked)
        addrs = [a for a, _ in want]
        assert [n for _, n in want] == [function, "main"], want
        assert any(a == addrs for a, _, _ in stacks), (function, want, stacks)
    text = run_memhook("report", mh.capture).stdout
    assert f"), musl {musl_version()}, " in text.splitlines()[0], text.splitlines()[0]
    note = [line for line in text.splitlines() if line.startswith("  libc.so: ")
            and "unwound by rows derived from their machine code" in line]
    assert len(note) == 1, text


@pytest.fixture(scope="module")
def musl_frameless(tmp_path_factory):
    """tests/targets/musl_frameless.c as Alpine builds programs: -O2, no frame pointers."""
    if shutil.which("musl-gcc") is None:
        pytest.fail("musl-gcc is not installed (scripts/setup.sh installs musl-tools)")
    d = tmp_path_factory.mktemp("musl-frameless")
    subprocess.run(["musl-gcc", "-g", "-O2", "-fomit-frame-pointer",
                    str(TARGETS / "musl_frameless.c"), "-o", str(d / "frameless")], check=True)
    return d / "frameless"


def gdb_callers(exe: Path, command: str, entry: str) -> list:
    """The return addresses gdb is sure of above musl's `entry` called from leak_COMMAND: where
    `finish` out of it lands, and main's (from leak_COMMAND, which has CFI)."""
    script = exe.parent / f"commands-{command}"
    script.write_text(f"{command}\nexit\n")
    out = subprocess.run(["gdb", "-nx", "-batch", "-ex", f"break leak_{command}",
                          "-ex", f"run < {script} > /dev/null", "-ex", "bt",
                          "-ex", f"break {entry}", "-ex", "continue", "-ex", "finish",
                          "-ex", 'printf "FINISHED %lx\\n", $pc', "-ex", "kill", str(exe)],
                         capture_output=True, text=True, timeout=180).stdout
    main = next(int(line.split()[1], 16) for line in out.splitlines()
                if line.startswith("#1 ") and " in main " in line)
    finished = next(int(line.split()[1], 16) for line in out.splitlines()
                    if line.startswith("FINISHED "))
    return [finished, main]


@pytest.mark.arm64
# (getline's block is from getdelim's second realloc: the first, with an empty buffer, asks for
# 3 bytes; on AArch64 gcc gave the two calls different sites)
@pytest.mark.parametrize("command, entry, hooked, skip", [
    ("strdup", "strdup", "malloc", 0), ("getline", "getline", "realloc", 1),
    ("fopen", "fopen", "malloc", 0)])
def test_musl_frameless_stacks_reach_main(tmp_path, musl_frameless, targets, command, entry,
                                          hooked, skip):
    """musl's strdup, getline and fopen (no call-frame information in its libc, no frame
    pointers in the program): the stack reaches the caller and main through rows derived from
    libc's machine code. Where gdb's bt is right it is equal: its frames in libc that it names
    (between them, its prologue analysis reads junk frames; past them, it stops short of the
    caller), and the caller's and main's return addresses, as `finish` out of musl's function
    and a bt in the caller give them."""
    target = targets(musl_frameless, argv=[*NO_ASLR, str(musl_frameless)])
    mh = Memhook(target.pid, tmp_path)
    target.command(command)
    report = mh.stop()
    assert target.finish() == 0
    named = [pc for pc, name in gdb_stack(musl_frameless, [command], f"leak_{command}", hooked,
                                          skip=skip)
             if name not in (None, "None", "??", f"leak_{command}", "main")]
    callers = gdb_callers(musl_frameless, command, entry)
    mine = [(addrs, names, s) for addrs, names, s in memhook_stacks(report)
            if names[-2:] == [f"leak_{command}", "main"] and s["outstanding_count"] == 1]
    assert len(mine) == 1, memhook_stacks(report)
    addrs, names, s = mine[0]
    assert addrs[-2:] == callers and addrs[:len(named)] == named, (addrs, named, callers)
    assert all(f.get("unwound") == "derived rows" for f in s["frames"][:-2]), s["frames"]


@pytest.mark.arm64
def test_musl_signal_handler_stack_goes_through_restore_rt(tmp_path, musl_frameless, targets):
    """A handler's allocation in a musl program: musl's __restore_rt has no call-frame
    information (gdb's bt calls it setjmp and reads junk past it), but its code is the signal
    trampoline's: memhook names it as gdb names a trampoline it knows and goes on through the
    ucontext to the instruction the signal interrupted, in musl's raise."""
    target = targets(musl_frameless, argv=[*NO_ASLR, str(musl_frameless)])
    mh = Memhook(target.pid, tmp_path)
    target.command("signal")
    report = mh.stop()
    assert target.finish() == 0
    (s,) = [s for s in report["sites"] if s["outstanding_bytes"] == 901]
    frames = s["frames"]
    assert [f["function"] for f in frames[:2]] == ["on_usr1", "<signal handler called>"], frames
    # The trampoline's frame is the return address the handler had: __restore_rt's first byte.
    assert "musl" in frames[1]["module"], frames[1]  # (its libc, which is its loader)
    with open(frames[1]["module"], "rb") as f:
        text = next(seg for seg in ELFFile(f).iter_segments() if seg["p_type"] == "PT_LOAD"
                    and seg["p_vaddr"] <= frames[1]["offset"] < seg["p_vaddr"] + seg["p_filesz"])
        at = frames[1]["offset"] - text["p_vaddr"]
        assert text.data()[at:at + len(arch.HOST.sigreturn_code)] == arch.HOST.sigreturn_code
    # Past it, the interrupted instruction, in musl's libc (before: the walk ended here).
    assert len(frames) >= 3 and frames[2]["module"] == frames[1]["module"], frames
    assert frames[2]["address"] != frames[1]["address"], frames


@pytest.mark.arm64
def test_musl_library_loaded_after_attach(tmp_path, musl_target, targets):
    """A musl library dlopen'ed while attached: its slots patched by the hook library itself,
    its leak exact, its frames named."""
    target = targets(musl_target)
    mh = Memhook(target.pid, tmp_path)
    target.command(f"dlopen {musl_target.parent / 'libplugin.so'}")
    time.sleep(1.0)  # its unwind rows: memhook looks for new libraries every 50 ms
    target.command("plugin 777")
    target.command("plugin 778")
    report = mh.stop()
    s = site(report, "plugin_inner")
    assert (s["outstanding_bytes"], s["outstanding_count"]) == (777 + 778, 2), s
    assert [f["function"] for f in s["frames"]] == ["plugin_inner", "main"], s["frames"]
    assert report["totals"]["outstanding_bytes"] == 777 + 778
    target.command("plugin 5")  # it keeps working after detach
    assert target.finish() == 0
