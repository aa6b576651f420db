"""The kernel's vDSO as a module (elf.vdso_module): it is no file, so memhook keeps the image it
reads from the target by build-id, where the unwind tables and the reports find it. On AArch64
its __kernel_rt_sigreturn is the frame below every signal handler (test_whole_stacks.py checks
the stacks through it in the arm64 tier); here, on either processor, the image, its rows and its
names against what the target really maps and what gdb names there."""
from __future__ import annotations

import subprocess
import time

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from memhook import _native
from memhook.common import arch, procfs
from memhook.elf import slots as elf
from memhook.elf import module_files
from memhook.symbolize import SIGNAL_FRAME, Symbolizer
from memhook.unwind import tables as unwind_tables


@pytest.fixture
def sleeper():
    """A program past its exec. Popen returns once exec has closed its close-on-exec pipe, and
    the kernel closes it before it maps the new image's vDSO: wait for the maps to show it."""
    proc = subprocess.Popen(["sleep", "60"])
    deadline = time.monotonic() + 30
    while not any(m.path == "[vdso]" for m in procfs.read_maps(proc.pid)):
        assert time.monotonic() < deadline, "sleep mapped no vDSO in 30 s"
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.arm64
def test_the_vdso_is_a_module_kept_by_build_id(sleeper, tmp_path, monkeypatch):
    monkeypatch.setenv(module_files.ENV, str(tmp_path / "store"))
    (vdso,) = [m for m in procfs.read_maps(sleeper.pid) if m.path == "[vdso]"]
    (module,) = [m for m in elf.modules(sleeper.pid).values() if m.path == "[vdso]"]
    assert (module.lo, module.hi) == (vdso.start, vdso.end)
    # The image kept is the target's, byte for byte, under its own build-id, owner-only.
    with procfs.Memory(sleeper.pid) as mem:
        image = mem.read(vdso.start, vdso.end - vdso.start)
    assert module.file == module_files.stored_path(module.build_id)
    assert open(module.file, "rb").read() == image
    assert elf.file_build_id(module.file) == module.build_id
    assert (tmp_path / "store").stat().st_mode & 0o077 == 0
    # Its call-frame information gives the hooks rows.
    rows = unwind_tables.rows_for(module.file, module.build_id, None).rows
    assert len(rows) >= 2 * _native.ROW_BYTES
    # Its functions are named as gdb names them (one of a function's aliases), through the kept
    # image alone.
    with open(module.file, "rb") as f:
        funcs = [(s.name, s["st_value"]) for s in ELFFile(f).get_section_by_name(".dynsym")
                 .iter_symbols() if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]]
    value = funcs[0][1]
    aliases = {name for name, v in funcs if v == value}
    gdb = subprocess.run(["gdb", "-q", "-batch", "-p", str(sleeper.pid), "-ex",
                          f"info symbol {module.bias + value:#x}"],
                         capture_output=True, text=True, timeout=120).stdout
    assert any(f"{name} in section" in gdb for name in aliases), (gdb, aliases)
    frame = Symbolizer([module]).frame_dicts(module.bias + value + 1)[0]  # (a return address)
    assert frame["function"] in aliases and frame["module"] == "[vdso]", (frame, aliases)


@pytest.mark.arm64
def test_the_vdso_signal_trampoline_gets_a_signal_row(sleeper, tmp_path, monkeypatch):
    """AArch64's vDSO has no .eh_frame: its __kernel_rt_sigreturn, where every handler returns,
    gets a signal row from its code (mov x8, #139; svc #0), so the hooks' walk goes on through
    the ucontext, and reports name the frame as gdb does. (x86-64's vDSO has no trampoline:
    glibc's __restore_rt has call-frame information of its own.)"""
    monkeypatch.setenv(module_files.ENV, str(tmp_path / "store"))
    (module,) = [m for m in elf.modules(sleeper.pid).values() if m.path == "[vdso]"]
    with open(module.file, "rb") as f:
        tramp = [s["st_value"] for s in ELFFile(f).get_section_by_name(".dynsym").iter_symbols()
                 if s.name == "__kernel_rt_sigreturn"]
    if not tramp:
        pytest.skip(f"this kernel's vDSO ({arch.HOST.name}) has no signal trampoline")
    rows = np.frombuffer(unwind_tables.rows_for(module.file, module.build_id, None).rows,
                         dtype=np.uint32).reshape(-1, 2)
    signal = [(int(a), int(b)) for (a, r), (b, _) in zip(rows[:-1], rows[1:])
              if r & 7 == _native.ROW_SIGNAL]
    assert signal == [(tramp[0] - 1, tramp[0] + 8)], (signal, hex(tramp[0]))
    frame = Symbolizer([module]).frame_dicts(module.bias + tramp[0])[0]  # (the return address)
    assert frame["function"] == SIGNAL_FRAME, frame


def test_a_vdso_written_over_is_not_kept(sleeper, tmp_path, monkeypatch):
    """The store is shared by every target's reports: a vDSO whose copy was written over in the
    target (its build-id kept, a byte changed; here through /proc/PID/mem, as a debugger
    writes) gets no module, and nothing is kept."""
    monkeypatch.setenv(module_files.ENV, str(tmp_path / "store"))
    (vdso,) = [m for m in procfs.read_maps(sleeper.pid) if m.path == "[vdso]"]
    with open(f"/proc/{sleeper.pid}/mem", "r+b", buffering=0) as mem:
        mem.seek(vdso.end - 1)
        last = mem.read(1)
        mem.seek(vdso.end - 1)
        mem.write(bytes([last[0] ^ 0xff]))
    assert not [m for m in elf.modules(sleeper.pid).values() if m.path == "[vdso]"]
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*"))
