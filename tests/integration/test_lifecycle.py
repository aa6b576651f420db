"""A session's life: threads, blocks from before attach, libraries loaded and unloaded while
attached, the size filter, detach and attach again."""
import os
import platform
import subprocess

import pytest

from conftest import ITERS, LEAKS, TARGETS, WORKERS, Memhook, build, site
from memhook.common.procfs import read_maps


@pytest.mark.arm64
def test_threads_and_cross_thread_frees(tmp_path, targets):
    target = targets(build(tmp_path, "threads.c"))
    mh = Memhook(target.pid, tmp_path)
    target.command("go")
    report = mh.stop()
    leak = site(report, "thread_leak")
    assert leak["outstanding_count"] == WORKERS * LEAKS
    assert leak["outstanding_bytes"] == sum(LEAKS * (1000 + w) for w in range(WORKERS))
    churn = site(report, "churn_alloc")
    assert churn["alloc_count"] == WORKERS * ITERS
    assert churn["alloc_bytes"] == WORKERS * sum(16 + i % 64 for i in range(ITERS))
    assert churn["free_count"] == WORKERS * ITERS  # half of them freed by another thread
    assert churn["outstanding_bytes"] == 0
    t = report["totals"]
    assert t["outstanding_bytes"] == leak["outstanding_bytes"]
    assert t["unknown_free_count"] == 0 and t["dropped_events"] == 0
    assert target.finish() == 0  # exit status 0: no block was corrupted


def lifecycle(tmp_path, targets):
    plugin = tmp_path / "libplugin.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-g", "-O0", "-fno-omit-frame-pointer",
                    str(TARGETS / "plugin.cpp"), "-o", str(plugin)],
                   check=True)
    return targets(build(tmp_path, "lifecycle.c"), plugin), plugin


def test_allocated_before_attach_freed_after(tmp_path, targets):
    target, _ = lifecycle(tmp_path, targets)
    target.command("early")
    mh = Memhook(target.pid, tmp_path)
    target.command("go")
    report = mh.stop()
    t = report["totals"]
    assert t["unknown_free_count"] == 50  # freed, but allocated before memhook was there
    assert (t["alloc_count"], t["outstanding_bytes"]) == (7, 7 * 99)
    assert site(report, "late_leak")["outstanding_bytes"] == 7 * 99
    assert target.finish() == 0


@pytest.mark.arm64
def test_library_loaded_after_attach(tmp_path, targets):
    target, plugin = lifecycle(tmp_path, targets)
    relocs = subprocess.run(["readelf", "-rW", str(plugin)], capture_output=True,
                            text=True).stdout
    absolute = {"x86_64": "R_X86_64_64", "aarch64": "R_AARCH64_ABS64"}[platform.machine()]
    assert any(absolute in line and " malloc" in line for line in relocs.splitlines())
    mh = Memhook(target.pid, tmp_path)
    assert target.ask("stdcxx", "stdcxx") == "stdcxx 0"  # C target: no libstdc++
    target.command("load")
    report = mh.stop()
    assert site(report, "plugin_leak_new")["outstanding_bytes"] == 8 * 777
    assert site(report, "plugin_leak_new")["operations"] == ["operator new"]
    assert site(report, "plugin_leak_malloc")["outstanding_bytes"] == 12 * 555
    assert site(report, "plugin_leak_table")["outstanding_bytes"] == 5 * 333
    assert report["totals"]["outstanding_bytes"] == 8 * 777 + 12 * 555 + 5 * 333
    target.command("go")  # the target keeps working after detach
    assert target.finish() == 0


def test_library_unloaded_while_attached(tmp_path, targets):
    target, _ = lifecycle(tmp_path, targets)
    mh = Memhook(target.pid, tmp_path)
    target.command("load")
    target.command("unload")
    report = mh.stop()  # detach must not write into the unloaded library's old addresses
    assert report["totals"]["outstanding_bytes"] == 8 * 777 + 12 * 555 + 5 * 333
    target.command("load")  # and loading it again untraced still works
    assert target.finish() == 0


def test_size_filter_inclusive(tmp_path, targets):
    target, _ = lifecycle(tmp_path, targets)
    mh = Memhook(target.pid, tmp_path, "--min-size", "1024", "--max-size", "64K")
    target.command("sizes")
    report = mh.stop()
    t = report["totals"]
    assert t["alloc_count"] == 9
    assert t["outstanding_bytes"] == 3 * (1024 + 5000 + 65536)
    assert target.finish() == 0


@pytest.mark.arm64
def test_detach_then_attach_again(tmp_path, targets):
    target, _ = lifecycle(tmp_path, targets)
    first = Memhook(target.pid, tmp_path)
    target.command("go")
    assert first.stop()["totals"]["outstanding_bytes"] == 7 * 99
    target.command("sizes")  # not traced
    second = Memhook(target.pid, tmp_path)
    target.command("second")
    report = second.stop()
    assert report["totals"]["alloc_count"] == 4
    assert site(report, "second_leak")["outstanding_bytes"] == 4 * 4321
    libs = {m.start for m in read_maps(target.pid) if "libmemhook_hook" in m.path}
    assert len([m for m in read_maps(target.pid) if "libmemhook_hook" in m.path
                and m.offset == 0]) == 1, "the second attach loaded the library again"
    assert libs
    assert target.finish() == 0


# The malloc hook compares stacks with AVX-512 where the CPU has it, else with SSE4.1: both.
COMPARISONS = pytest.mark.parametrize("compare", ["native", "sse"])


def use_comparison(monkeypatch, compare):
    if compare == "sse":
        monkeypatch.setenv("MEMHOOK_NO_AVX512", "1")


@pytest.mark.arm64
@COMPARISONS
def test_backtrace_depth(tmp_path, targets, monkeypatch, compare):
    """40 allocations from one stack 60 frames deep: the first walks, the rest find the stack in
    a slot. The malloc hook compares up to 32 frame pairs itself (depth 33: 32 pairs after the
    call site) and leaves deeper stacks to the compiled comparison."""
    use_comparison(monkeypatch, compare)
    target, _ = lifecycle(tmp_path, targets)
    for args, depth in (((), 32), (("--depth", "33"), 33), (("--depth", "50"), 50)):
        mh = Memhook(target.pid, tmp_path, *args)
        target.command("deep")
        found = site(mh.stop(), "deep")
        assert (found["alloc_count"], found["outstanding_bytes"]) == (40, 40 * 77)
        assert len(found["frames"]) == depth
        assert all(f["function"] == "deep" for f in found["frames"])
    assert target.finish() == 0


@COMPARISONS
def test_same_call_site_from_different_callers(tmp_path, targets, monkeypatch, compare):
    """Alternating stacks that agree at the call site (same stack pointer, frame and return
    address) and differ two frames up, then one of them alone: each allocation is charged to
    its own stack. With a realloc: the grown block is charged to the realloc's stack, the
    small one it replaced is freed."""
    use_comparison(monkeypatch, compare)
    target, _ = lifecycle(tmp_path, targets)
    for command in ("twins", "twins_grow"):
        mh = Memhook(target.pid, tmp_path)
        target.command(command)
        report = mh.stop()
        for caller, calls, size in (("twin_a", 300, 111), ("twin_b", 200, 222)):
            sites = [s for s in report["sites"] if len(s["frames"]) > 2
                     and s["frames"][2]["function"] == caller]
            assert all([f["function"] for f in s["frames"][:2]] == ["twin_leaf", "twin_mid"]
                       for s in sites)
            kept = [(s["alloc_count"], s["outstanding_bytes"]) for s in sites
                    if s["outstanding_bytes"]]
            assert kept == [(calls, calls * size)], (command, caller, kept)
            freed = [s for s in sites if not s["outstanding_bytes"]]
            if command == "twins_grow":
                assert [(s["alloc_count"], s["free_count"]) for s in freed] == [(calls, calls)]
            else:
                assert not freed
    assert target.finish() == 0


def test_a_slot_the_loader_bound_over_the_hook(tmp_path, targets):
    """A thread inside the dynamic loader's lazy binding of a first call as memhook patches
    the slot stores the real function after the hook (seen once in 200 attach/detach cycles of
    a busy target at nice 19). The loader's store is made here as the loader makes it: at
    detach that slot holds the real function, nothing of memhook's; it is left so, counted
    restored, and memhook says that calls through it went untraced."""
    from memhook.consumer.session import Options, Session
    from memhook.elf import slots as elf
    exe = build(tmp_path, "threads.c")
    target = targets(exe)
    layout = elf.scan(target.pid, str(exe))
    session = Session(target.pid, Options())
    session.attach()
    try:
        hook_of = {s.addr: s.hook_id for s in layout.slots}
        addr = next(a for a, _, _ in session.patched if layout.real.get(hook_of.get(a)))
        real = layout.real[hook_of[addr]]
        fd = os.open(f"/proc/{target.pid}/mem", os.O_RDWR)
        try:
            os.pwrite(fd, real.to_bytes(8, "little"), addr)  # the loader's _dl_fixup store
        finally:
            os.close(fd)
    finally:
        session.detach("test")
    assert session.rebound == [addr]
    assert not session.not_restored and not session.detach_error
    fd = os.open(f"/proc/{target.pid}/mem", os.O_RDONLY)
    try:
        assert int.from_bytes(os.pread(fd, 8, addr), "little") == real
    finally:
        os.close(fd)
