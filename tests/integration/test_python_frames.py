"""Python frames (issue 45): memhook attached to a running CPython 3.8-3.13 with nothing
installed in it names each allocation's Python functions, files and lines, in place of the
interpreter's own frames, byte for byte against what the program kept and what tracemalloc saw."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import Memhook, Target, memhook_cmd, report_json, run_memhook

PYTHON_TARGETS = Path(__file__).parent.parent / "targets" / "python"
PYENV = Path("/root/.pyenv/versions")
# Every minor version the issue names, as pyenv built them, and Debian's own (statically linked,
# stripped).
INTERPRETERS = {f"3.{m}": next(iter(sorted(PYENV.glob(f"3.{m}.*/bin/python3.{m}"))), None)
                for m in range(8, 14)}
INTERPRETERS["debian-3.11"] = Path("/usr/bin/python3.11")


def versions(*names):
    """Parameters for these versions; Debian's own also runs in the arm64 tier (issue 46: the
    guest's python3.11)."""
    return [pytest.param(v, marks=pytest.mark.arm64) if v == "debian-3.11" else v for v in names]


def marker_line(name: str, marker: str) -> int:
    lines = (PYTHON_TARGETS / name).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(marker))


def service(targets, python: Path, tmp_path: Path, *args, extension: bool = False):
    """leak_service.py run by `python` from a directory of its own."""
    assert python is not None and python.exists(), f"no interpreter {python}"
    for f in ("leak_service.py", "leak_module.py"):
        shutil.copy(PYTHON_TARGETS / f, tmp_path / f)
    if extension:
        include, suffix = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['include']);"
             "print(sysconfig.get_config_var('EXT_SUFFIX'))"],
            capture_output=True, text=True, check=True).stdout.split()
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", f"-I{include}",
                        str(PYTHON_TARGETS / "leak_ext.c"), "-o", str(tmp_path / f"leak_ext{suffix}")],
                       check=True)
    return targets(tmp_path / "leak_service.py",
                   argv=[str(python), "leak_service.py", *args], cwd=tmp_path)


def python_frames(site: dict) -> list:
    return [(f["function"], os.path.basename(f["file"] or ""), f["line"])
            for f in site["frames"] if f.get("kind") == "python"]


def attributed(site: dict) -> dict:
    return site["frames"][site["attributed_frame"]]


def by_native(sites: list, function: str) -> list:
    """The sites with a native frame named `function` (the C function that allocated)."""
    return [s for s in sites if any((f["function"] or "") == function and not f.get("kind")
                                    for f in s["frames"])]


@pytest.mark.parametrize("version", versions(*INTERPRETERS))
def test_a_leak_is_named_by_its_python_function_and_line(targets, tmp_path, version):
    python = INTERPRETERS[version]
    t = service(targets, python, tmp_path, "--tracemalloc")
    mh = Memhook(t.pid, tmp_path)
    for command in ("leak", "churn", "leak", "churn", "leak"):
        t.command(command)
    stats = t.ask("stats", "stats").split()
    rep = mh.stop()
    assert t.finish() == 0
    assert rep["python"]["frames"], rep["python"]
    leak, handle, main = (marker_line("leak_module.py", 'f"item-{i}"})'),
                          marker_line("leak_service.py", "# HANDLE"),
                          marker_line("leak_service.py", "# MAIN"))
    mine = [s for s in rep["sites"] if attributed(s)["function"] == "leak_here"]
    assert mine, [python_frames(s) for s in rep["sites"][:5]]
    for s in mine:  # (the loop's own line too, and tracemalloc's tables under these frames)
        assert python_frames(s)[1:3] == [("handle", "leak_service.py", handle),
                                         ("main", "leak_service.py", main)], python_frames(s)
        assert python_frames(s)[3][0] == "<module>"
    # No _PyEval_EvalFrameDefault left where a Python frame stands for it.
    assert not [f for s in mine for f in s["frames"]
                if (f["function"] or "").startswith("_PyEval_EvalFrameDefault")]
    # What the line keeps, byte for byte and block for block, as tracemalloc in the same program
    # counted it (both see PyObject_Malloc's calls; memhook's hooks hold tracemalloc's own
    # tables, allocated inside the call, as part of it): 3,000 dicts, their keys and names,
    # the list's growth.
    tm_bytes, tm_blocks, kept = int(stats[2]), int(stats[3]), int(stats[5])
    assert kept == 3000 and rep["python"]["allocators"]
    at_line = [s for s in mine if python_frames(s)[0] == ("leak_here", "leak_module.py", leak)]
    assert sum(s["outstanding_bytes"] for s in at_line) == tm_bytes
    assert sum(s["outstanding_count"] for s in at_line) == tm_blocks >= 6000
    assert {"PyObject_Malloc", "PyMem_Realloc"} <= {o for s in at_line for o in s["operations"]}
    # Held by the list, so reachable (the list points past each dict's collector header:
    # interior_heuristics.h's pythonobject), none possibly lost.
    assert sum(s["reachable_count"] for s in at_line) == tm_blocks
    assert not sum(s["possibly_lost_count"] + s["definitely_lost_count"] for s in at_line)
    # The churn: named, and all freed.
    churn = [s for s in rep["sites"] if s["frames"] and attributed(s)["function"] in (
        "churn", "churn.<locals>.<listcomp>", "<listcomp>")
        and s["alloc_bytes"] >= 2033 * s["alloc_count"]]  # (its bytes; not tracemalloc's)
    assert churn and sum(s["alloc_count"] for s in churn) >= 2000
    assert sum(s["outstanding_bytes"] for s in churn) == 0
    assert attributed(churn[0])["line"] == marker_line("leak_service.py", "# CHURN")


def traced_command(targets, version: str, tmp_path, command: str) -> dict:
    """The report of memhook attached to leak_service.py while it runs `command`."""
    t = service(targets, INTERPRETERS[version], tmp_path)
    mh = Memhook(t.pid, tmp_path)
    t.command(command)
    rep = mh.stop()
    assert t.finish() == 0
    return rep


def kept_bytes_object(rep: dict, function: str, size: int) -> list:
    """The one site of the bytes object of `size` bytes `function` kept (a bytes object's
    block: its header and NUL beside its bytes)."""
    sites = [s for s in rep["sites"] if attributed(s)["function"] == function
             and s["alloc_bytes"] == size + 33]
    assert len(sites) == 1, [python_frames(s) for s in rep["sites"][:8]]
    return sites


@pytest.mark.parametrize("version", ["3.8", "3.11", "3.13"])
def test_each_thread_names_its_own_function(targets, tmp_path, version):
    rep = traced_command(targets, version, tmp_path, "threads")
    for n, size in enumerate((3000, 3100, 3200, 3300)):
        sites = kept_bytes_object(rep, f"thread_{n}", size)
        assert sites[0]["outstanding_count"] == 1
        assert python_frames(sites[0])[0] == (f"thread_{n}", "leak_service.py",
                                              marker_line("leak_service.py", f"# THREAD {n}"))
        below = python_frames(sites[0])[1:]  # threading's, to its thread's first frame
        assert below and all(file == "threading.py" for _, file, _ in below), below
        assert below[0][0] in ("Thread.run", "run") and below[-1][0].endswith("_bootstrap")


@pytest.mark.parametrize("version", versions("3.9", "3.12", "debian-3.11"))
def test_code_made_by_exec_and_freed_keeps_its_name(targets, tmp_path, version):
    rep = traced_command(targets, version, tmp_path, "exec")
    for n, size in ((1, 4001), (2, 4002)):
        sites = kept_bytes_object(rep, f"made_by_exec_{n}", size)
        frames = python_frames(sites[0])
        assert frames[0] == (f"made_by_exec_{n}", "<string>", 3)
        assert frames[1] == ("<module>", "<string>", 4)
        assert frames[2][:2] == ("run_exec", "leak_service.py")
        assert sites[0]["outstanding_bytes"] == size + 33  # (kept)


@pytest.mark.parametrize("version", ["3.10", "3.13"])
def test_a_c_extension_leak_shows_the_c_function_under_its_python_caller(targets, tmp_path,
                                                                          version):
    t = service(targets, INTERPRETERS[version], tmp_path, extension=True)
    t.command("ext")  # (imported before attach: the extension's own first allocations aside)
    mh = Memhook(t.pid, tmp_path)
    t.command("ext")
    rep = mh.stop()
    assert t.finish() == 0
    [s] = by_native(rep["sites"], "ext_keep_block")
    assert s["outstanding_bytes"] == 5000 and s["outstanding_count"] == 1
    names = [f["function"] for f in s["frames"]]
    assert names.index("ext_keep_block") < names.index("ext_leak") < names.index("call_extension")
    assert python_frames(s)[0] == ("call_extension", "leak_service.py",
                                   marker_line("leak_service.py", "# EXTENSION"))
    assert attributed(s)["function"] == "call_extension"


@pytest.mark.parametrize("version", ["3.8", "3.11", "3.13"])
def test_frames_equal_py_spys_of_the_paused_target(targets, tmp_path, version):
    """The extension keeps a block and waits: py-spy dump --native reads the thread standing
    where memhook recorded the allocation. The same Python frames (name, file, line) and the
    same native frames where py-spy names them, in the same order."""
    t = service(targets, INTERPRETERS[version], tmp_path, extension=True)
    t.command("ext")  # (imported before attach)
    os.mkfifo(tmp_path / "wait.fifo")
    mh = Memhook(t.pid, tmp_path)
    t.proc.stdin.write("wait\n")
    t.proc.stdin.flush()
    dump = ""
    for _ in range(100):  # until the thread stands in the extension
        dump = subprocess.run([str(Path(sys.executable).parent / "py-spy"), "dump", "--native",
                               "--pid", str(t.pid)], capture_output=True, text=True).stdout
        if "ext_keep_and_wait" in dump:
            break
        time.sleep(0.1)
    with open(tmp_path / "wait.fifo", "w"):
        pass
    t.expect("done")
    rep = mh.stop()
    assert t.finish() == 0
    thread = dump.split('"MainThread"', 1)[1].strip().splitlines()
    spy = [re.fullmatch(r"\s*(\S+) \((.+?)(?::(\d+))?\)", line).groups() for line in thread]
    spy = [(name, os.path.basename(where), int(line) if line else None)
           for name, where, line in spy[1:] if not name.startswith("0x")]  # (the wait itself)
    [s] = [s for s in rep["sites"] if any(f["function"] == "ext_keep_and_wait"
                                           for f in s["frames"])]
    ours = [(f["function"], os.path.basename(f["file"] or ""), f["line"]) for f in s["frames"]]
    named = {name for name, _, _ in spy}
    # (native lines differ: the thread stands at the wait now, the block's call then)
    assert [f[0] for f in ours if f[0] in named] == [f[0] for f in spy], (ours, dump)
    assert python_frames(s) == [f for f in spy if f[1] == "leak_service.py"]
    assert len(python_frames(s)) == 4 and s["outstanding_bytes"] == 6000


@pytest.mark.parametrize("version", ["3.9", "3.12"])
def test_a_forked_workers_python_frames_are_named(tmp_path, version):
    """memhook run --follow-fork -- python3 workers.py: multiprocessing's forked worker is a
    process of the run, its 1,000 dicts named by the worker's function and line."""
    shutil.copy(PYTHON_TARGETS / "workers.py", tmp_path / "workers.py")
    report_file = tmp_path / "report.json"
    # (--lossless: on a loaded machine a full ring at default settings drops a stretch of the
    # worker's events, its dicts among them; this test is about their names.)
    proc = subprocess.run(memhook_cmd("run", "--no-live", "--follow-fork", "--lossless",
                                      "--format", "json",
                                      "--report-file", report_file, "-o", tmp_path / "run.mh",
                                      "--", INTERPRETERS[version], tmp_path / "workers.py"),
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "worker exit code 0" in proc.stdout
    rep = json.loads(report_file.read_text())
    pids = [p["pid"] for p in rep["processes"]]
    assert len(pids) == 2, rep["processes"]
    worker = report_json(tmp_path / "run.mh", "--pid", str(pids[1]))
    line = marker_line("workers.py", "# WORKER")
    mine = [s for s in worker["sites"] if attributed(s)["function"] == "work_in_child"
            and attributed(s)["line"] == line]
    assert sum(s["outstanding_count"] for s in mine) >= 2000, (  # the dicts, their names
        worker["python"], worker["totals"], [(attributed(s), python_frames(s)[:3]) for s in
                                             worker["sites"][:4]])
    for s in mine:
        assert python_frames(s)[0] == ("work_in_child", "workers.py", line)
        assert [f for f, _, _ in python_frames(s)[1:3]] in (
            ["BaseProcess.run", "BaseProcess._bootstrap"], ["run", "_bootstrap"])
    # The merged report names them too (code records renumbered across the processes).
    merged = [s for s in rep["sites"] if s["frames"] and attributed(s)["function"] ==
              "work_in_child" and attributed(s)["line"] == line]
    assert sum(s["outstanding_count"] for s in merged) == sum(s["outstanding_count"] for s in mine)


PYTHON_ALLOCATOR = {f"Py{d}_{f}" for d in ("Object", "Mem") for f in ("Malloc", "Calloc",
                                                                       "Realloc")}


def test_gunicorns_workers_are_named(tmp_path):
    """memhook run --follow-fork -- gunicorn -w 2 (pre-forked workers, as gunicorn serves):
    each worker is a process of the run, and what its requests kept is named by the view's
    function and line, byte for byte and block for block what tracemalloc in that worker says
    the line holds."""
    import socket
    import urllib.request
    for f in ("wsgi_leak.py", "gunicorn_leak.conf.py"):
        shutil.copy(PYTHON_TARGETS / f, tmp_path / f)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    report_file, pidfile = tmp_path / "report.txt", tmp_path / "gunicorn.pid"
    run = subprocess.Popen(memhook_cmd("run", "--no-live", "--follow-fork", "--lossless",
                                       "--report-file", report_file, "-o", tmp_path / "run.mh",
                                       "--", sys.executable, "-m", "gunicorn", "-w", "2",
                                       "-c", "gunicorn_leak.conf.py", "-b", f"127.0.0.1:{port}",
                                       "--pid", pidfile, "wsgi_leak:app"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path)
    try:
        held = {}  # worker pid -> (bytes, blocks) tracemalloc says the line holds
        deadline = time.monotonic() + 120
        for _ in range(12):
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/leak",
                                                timeout=60) as r:
                        pid, size, count = map(int, r.read().split())
                    held[pid] = (size, count)
                    break
                except OSError:
                    assert run.poll() is None and time.monotonic() < deadline, run.stderr.read()
                    time.sleep(0.2)
        os.kill(int(pidfile.read_text()), signal.SIGTERM)  # gunicorn stops its workers
        _, err = run.communicate(timeout=240)
    finally:
        run.kill()
    assert run.returncode == 0 and "Traceback" not in err, err
    # (The master's report alone is 124,000 stacks of imports: the workers' are read by name.)
    text = report_file.read_text()
    pids = {int(p) for p in re.findall(r"^  PID (\d+) \(", text, re.M)}
    assert set(held) <= pids and len(pids) >= 3, (held, text[:2000])
    line = marker_line("wsgi_leak.py", "# VIEW")
    for pid, (size, count) in held.items():
        worker = report_json(tmp_path / "run.mh", "--pid", str(pid), "--function",
                             "leak_in_view")
        mine = [s for s in worker["sites"] if attributed(s)["function"] == "leak_in_view"
                and attributed(s)["line"] == line]
        assert mine and all(python_frames(s)[0] == ("leak_in_view", "wsgi_leak.py", line)
                            and python_frames(s)[1][0] == "app" for s in mine)
        # tracemalloc, started in the worker after memhook's hooks, wraps them: its own tables
        # (malloc, inside its hook) are the line's too but not in its count; its calls through
        # to PyObject_Malloc are what it counts.
        mine = [s for s in mine if set(s["operations"]) <= PYTHON_ALLOCATOR]
        assert count >= 500 and (sum(s["outstanding_bytes"] for s in mine),
                                  sum(s["outstanding_count"] for s in mine)) == (size, count)


ROOTS = Path(os.environ.get("MEMHOOK_ROOTS", "/var/cache/memhook-roots"))


@pytest.mark.parametrize("root, version", [("bullseye-bare", "3.9."), ("trixie-bare", "3.13.")])
def test_a_containers_python_is_named(tmp_path, root, version):
    """Debian 11's python3.9 and Debian 13's python3.13 in a mount namespace whose root is
    theirs (as a container runtime runs them: the target's maps name the container's paths):
    nothing installed in it, the leak named by its Python function and line, and the dicts
    counted as tracemalloc counts them."""
    from test_libcs import ENTER
    base = ROOTS / root
    if not (base / ".memhook-root").exists():
        message = f"no {root} root in {ROOTS}: scripts/roots.sh builds it"
        if os.environ.get("MEMHOOK_REQUIRE_ROOTS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    (base / "opt").mkdir(exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="memhook-test-", dir=base / "opt"))
    try:
        os.chmod(d, 0o755)
        for f in ("leak_service.py", "leak_module.py"):
            shutil.copy(PYTHON_TARGETS / f, d / f)
        inside = "/" + str(d.relative_to(base))
        t = Target(d / "leak_service.py", argv=[
            "unshare", "--mount", "--propagation", "private", "sh", "-c", ENTER, "sh", str(base),
            "", "sh", "-c", f"cd {inside} && exec python3 leak_service.py --tracemalloc"])
        try:
            mh = Memhook(t.pid, tmp_path)
            for _ in range(3):
                t.command("leak")
            stats = t.ask("stats", "stats").split()
            rep = mh.stop()
            assert t.finish() == 0
        finally:
            t.kill()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert rep["python"]["frames"] and rep["python"]["version"].startswith(version), rep["python"]
    leak = marker_line("leak_module.py", 'f"item-{i}"})')
    at_line = [s for s in rep["sites"] if python_frames(s)
               and python_frames(s)[0] == ("leak_here", "leak_module.py", leak)]
    assert at_line and all(python_frames(s)[1][:2] == ("handle", "leak_service.py")
                           for s in at_line)
    assert (sum(s["outstanding_bytes"] for s in at_line),
            sum(s["outstanding_count"] for s in at_line)) == (int(stats[2]), int(stats[3])), (
        rep["python"], [(s["outstanding_bytes"], s["outstanding_count"], s["operations"],
                         [f["function"] for f in s["frames"][:4]]) for s in at_line])


def test_a_debug_build_is_refused_in_one_line(targets, tmp_path):
    """Debian's python3.11d (Py_DEBUG: every object two words longer): its frames are not read,
    and the report says why in one line; its native stacks are whole all the same."""
    t = service(targets, Path("/usr/bin/python3.11d"), tmp_path)
    mh = Memhook(t.pid, tmp_path)
    t.command("leak")
    rep = mh.stop()
    assert t.finish() == 0
    assert rep["python"]["frames"] is False and "debug build" in rep["python"]["why"]
    assert not [f for s in rep["sites"] for f in s["frames"] if f.get("kind") == "python"]
    from conftest import report
    lines = [line for line in report(mh.capture).stdout.splitlines()
             if "Python frames not read" in line]
    assert lines == ["  Python frames not read: CPython 3.11.2 is a debug build: memhook reads "
                     "the frames of release builds"], lines


@pytest.mark.parametrize("version", ["3.11", "3.13"])
def test_sampling_names_python_frames_too(targets, tmp_path, version):
    """--sample-rate: each sample carries its Python frames; the leak's estimate is near the
    bytes tracemalloc counts for the line."""
    t = service(targets, INTERPRETERS[version], tmp_path, "--tracemalloc")
    mh = Memhook(t.pid, tmp_path, "--sample-rate", "4KiB")
    for _ in range(5):
        t.command("leak")
    stats = t.ask("stats", "stats").split()
    rep = mh.stop()
    assert t.finish() == 0
    leak = marker_line("leak_module.py", 'f"item-{i}"})')
    at_line = [s for s in rep["sites"] if python_frames(s)
               and python_frames(s)[0] == ("leak_here", "leak_module.py", leak)]
    assert at_line and all(python_frames(s)[1][0] == "handle" for s in at_line)
    estimate, tm = sum(s["outstanding_bytes"] for s in at_line), int(stats[2])
    assert 0.7 * tm < estimate < 1.3 * tm, (estimate, tm)


@pytest.mark.parametrize("version", versions("3.9", "debian-3.11", "3.13"))
def test_detach_puts_the_allocator_structs_back(targets, tmp_path, version):
    """The structs PyObject_Malloc and PyMem_Malloc call through hold the session's hooks while
    it lasts and their own functions again after it; the program goes on allocating."""
    from memhook.common.procfs import Memory
    from memhook.elf import slots as elf
    from memhook.inject import python_interpreter
    t = service(targets, INTERPRETERS[version], tmp_path)
    layout = elf.scan(t.pid, os.path.realpath(f"/proc/{t.pid}/exe"))
    found = python_interpreter.find(t.pid, layout.objects)
    structs = [found.layout["mem_allocator"], found.layout["obj_allocator"]]
    assert all(structs), found.describe()

    def words():
        with Memory(t.pid) as mem:
            return [mem.read(at, 40) for at in structs]
    before = words()
    mh = Memhook(t.pid, tmp_path)
    t.command("leak")
    during = words()
    rep = mh.stop()
    assert rep["python"]["allocators"]
    assert [w[:8] for w in during] == [w[:8] for w in before]  # (ctx left alone)
    assert all(d[8:] != b[8:] for d, b in zip(during, before))  # (its four functions hooked)
    assert words() == before
    t.command("leak")  # (it goes on, through its own functions)
    t.command("churn")
    assert t.finish() == 0


def test_no_pymalloc_leaves_the_allocator_alone_and_says_so(targets, tmp_path):
    """--no-pymalloc (memray's default: objects seen as arenas only): the structs keep their
    own functions through the session, no PyObject_Malloc event is recorded, and the text says
    what was not traced rather than showing a Python program without objects."""
    from memhook.common.procfs import Memory
    from memhook.elf import slots as elf
    from memhook.inject import python_interpreter
    t = service(targets, INTERPRETERS["3.12"], tmp_path)
    layout = elf.scan(t.pid, os.path.realpath(f"/proc/{t.pid}/exe"))
    found = python_interpreter.find(t.pid, layout.objects)
    structs = [found.layout["mem_allocator"], found.layout["obj_allocator"]]

    def words():
        with Memory(t.pid) as mem:
            return [mem.read(at, 40) for at in structs]
    before = words()
    mh = Memhook(t.pid, tmp_path, "--no-pymalloc")
    t.command("leak")
    assert words() == before
    rep = mh.stop()
    assert t.finish() == 0
    assert rep["python"]["frames"] and not rep["python"]["allocators"]
    assert "--no-pymalloc" in rep["python"]["allocators_why"]
    assert not [s for s in rep["sites"]
                if {"PyObject_Malloc", "PyMem_Malloc"} & set(s["operations"])]
    text = run_memhook("report", mh.capture).stdout
    assert "CPython's allocator not hooked (--no-pymalloc): Python objects are seen as " \
        "pymalloc's arenas only" in text


def test_html_page_shows_python_frames_in_chromium(targets, tmp_path):
    """The HTML page of a Python program's capture as a browser shows it: the flame graph draws
    the Python functions as a kind of their own (not the native frames' colour), the search for
    the leaking function sums the blocks the JSON gives its stacks, and a table's stack leads
    with that function's file and line; no runtime address where a name exists."""
    from test_views import RAW_ADDRESS, open_in_chromium
    t = service(targets, INTERPRETERS["3.12"], tmp_path)
    mh = Memhook(t.pid, tmp_path, "--lossless")
    for _ in range(2):
        t.command("leak")
    rep = mh.stop()
    assert t.finish() == 0
    page = tmp_path / "report.html"
    assert run_memhook("report", mh.capture, "--format", "html", "-o", page).returncode == 0
    searched = open_in_chromium(tmp_path, page, "#search=leak_here&weight=count")
    hits = re.findall(r'class="match" title="leak_here — (\d+) blocks \(([^)]*)\)', searched)
    total = sum(s["alloc_count"] for s in rep["sites"]
                if any(f["function"] == "leak_here" for f in s["frames"]))
    assert hits and sum(int(n) for n, _ in hits) == total >= 6000, (hits, total)
    colours = {k: set(re.findall(rf'data-kind="{k}"[^>]*background: (rgb\([^)]*\))', searched))
               for k in "0123"}
    python_colour = {c for c in colours["3"]}
    assert python_colour and not python_colour & (colours["0"] | colours["1"] | colours["2"])
    line = marker_line("leak_module.py", 'f"item-{i}"})')
    assert re.search(rf'<summary>leak_here  \S*leak_module\.py:{line}(  \(via [^<]*)?</summary>',
                     searched)
    text = re.sub(r"<script.*?</script>", "", searched, flags=re.S)
    assert not RAW_ADDRESS.search(text), RAW_ADDRESS.search(text)
