"""The native parts on their own: the consumer's stack table, live map and event timing in a
C++ program (tests/unit/native/), the sampler through the real hook library loaded in-process,
and unwind rows from an object whose code is known."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HOOK_CPP = Path(__file__).parents[2] / "hook_cpp"
NATIVE = Path(__file__).parent / "native"


def compile_and_run(tmp_path: Path, source: str, arch: str = "x86_64",
                    runner: tuple = ()) -> str:
    """Build `source` for `arch` (aarch64: cross-built, static, with pointer authentication and
    BTI as -mbranch-protection=standard makes them) and run it (under `runner`: qemu-user)."""
    exe = tmp_path / f"{Path(source).stem}-{arch}"
    compiler = ["g++"] if arch == "x86_64" else \
        ["aarch64-linux-gnu-g++", "-static", "-mbranch-protection=standard"]
    subprocess.run([*compiler, "-std=c++17", "-O1", "-g", *(f"-I{HOOK_CPP / d}" for d in (
        "common", "consumer", "census", f"arch/{arch}")), str(NATIVE / source), "-o", str(exe)],
        check=True, capture_output=True, text=True)
    out = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_consumer_parts(tmp_path):
    out = compile_and_run(tmp_path, "consumer_parts.cpp")
    checks, failed = (int(x) for x in out.split()[-3::2])
    assert failed == 0 and checks > 10, out


# qemu-user's CPU models: "max" signs return addresses (pointer authentication), a Cortex-A57
# has no such thing (issue 46: the native tier with PAC on and off).
@pytest.mark.parametrize("cpu", ["max", "cortex-a57"])
def test_consumer_parts_on_aarch64(tmp_path, cpu):
    out = compile_and_run(tmp_path, "consumer_parts.cpp", "aarch64",
                          ("qemu-aarch64-static", "-cpu", cpu))
    checks, failed = (int(x) for x in out.split()[-3::2])
    assert failed == 0 and checks > 10, out
    # the return addresses it stripped were signed where the CPU has PAC, and only there
    assert f"signed {int(cpu == 'max')}" in out, out


def sampled(tmp_path: Path, rate: int, count: int, size: int) -> int:
    """How many of `count` calls of memhook_sample_malloc(size) the real hook library records
    in a segment of sampling mode at `rate` (the harness loads it in-process)."""
    import harness
    from memhook import _native
    from memhook.elf import hooks
    ring_bytes, depth = 1 << 20, 8
    stdout, segment = harness.run(tmp_path, "sampler_harness.cpp", count, size,
                                  ring_bytes=ring_bytes, depth=depth, sample_rate=rate)
    assert "start 0" in stdout and f"returned {count}" in stdout  # every call got its block
    body, write = harness.ring(segment, ring_bytes, depth)
    malloc = hooks.BY_SYMBOL["malloc"].id
    records = _native.decode_records(body, 0, write)
    assert all(r[1] is not None for r in records)
    return sum(1 for r in records if r[1] == _native.RECORD_KINDS["alloc"] and r[2] == malloc)


@pytest.mark.parametrize("size", [256, 1024, 4096])
def test_sampler_chooses_with_its_probability(tmp_path, size):
    """Each call of Z bytes is recorded with probability 1 - exp(-Z/rate), whatever came before
    it (the countdown is exponential): the count of 20,000 calls lies within four standard
    deviations of that."""
    import math
    rate, count = 4096, 20000
    p = 1 - math.exp(-size / rate)
    got = sampled(tmp_path, rate, count, size)
    assert abs(got - count * p) <= 4 * math.sqrt(count * p * (1 - p)), (got, count * p)


def test_sampler_takes_large_blocks_nearly_always(tmp_path):
    got = sampled(tmp_path, 4096, 2000, 1 << 20)  # p = 1 - exp(-256)
    assert got == 2000


def rules(exe: Path) -> dict[int, tuple]:
    """The rows memhook builds for `exe` (common/unwind_rows.h): start -> (kind, CFA offset,
    rbp rule, rbp slot, last)."""
    import struct

    from memhook import _native
    rows, info = _native.cfi_rows(str(exe))
    assert not info["problem"], info
    out = {}
    for at in range(0, len(rows), _native.ROW_BYTES):
        start, r = struct.unpack_from("<II", rows, at)
        out[start] = (r & 7, (r >> 16) * 8, r >> 3 & 3, r >> 5 & 1023, bool(r & _native.ROW_LAST))
    return out


def rule_at(table: dict, pc: int) -> tuple:
    return table[max(s for s in table if s <= pc)]


RSP, RBP, SAVED = 1, 2, 1


def test_unwind_rows_of_a_known_object(tmp_path):
    """Rows built from a file whose code is known: each rule holds from the instruction after
    the one that changed the frame, as the disassembly shows it."""
    import synthetic
    exe = synthetic.compile_program(tmp_path)
    table = rules(exe)

    code = synthetic.instructions(exe, "framed")
    assert rule_at(table, code[0][0])[:2] == (RSP, 8)  # the return address only
    after = {text.split()[0] + " " + "".join(text.split()[1:]): code[i + 1][0]
             for i, (_, text) in enumerate(code[:-1])}
    assert rule_at(table, after["push %rbp"])[:4] == (RSP, 16, SAVED, 2)
    assert rule_at(table, after["mov %rsp,%rbp"])[:4] == (RBP, 16, SAVED, 2)

    code = synthetic.instructions(exe, "frameless")
    assert rule_at(table, code[0][0])[:2] == (RSP, 8)
    depth = 8
    for (_, text), (nxt, _) in zip(code, code[1:]):
        op, *args = text.split(None, 1)
        if op == "push":
            depth += 8
        elif op == "sub" and args[0].endswith(",%rsp"):
            depth += int(args[0].split(",")[0].lstrip("$"), 16)
        else:
            continue
        assert rule_at(table, nxt)[:2] == (RSP, depth), (text, hex(nxt))
        break
    else:
        pytest.fail("frameless() moved no stack pointer: nothing to check")
    assert all(rule_at(table, pc)[0] == RSP for pc, _ in code)  # never rbp

    main = synthetic.instructions(exe, "main")
    assert all(rule_at(table, pc)[4] for pc, _ in main)  # the walk ends at main
    assert not rule_at(table, code[0][0])[4]


def test_unwind_rows_without_a_search_table(tmp_path):
    """A program linked without .eh_frame_hdr (as musl-gcc links): the same rows, read from
    .eh_frame's own entries."""
    import synthetic
    from memhook import _native
    with_table = synthetic.compile_program(tmp_path)
    without = synthetic.compile_program(tmp_path, ["-Wl,--no-eh-frame-hdr"], "no_table")
    sections = subprocess.run(["readelf", "-SW", str(without)], capture_output=True, text=True,
                              check=True).stdout
    assert ".eh_frame_hdr" not in sections and ".eh_frame" in sections
    rows, info = _native.cfi_rows(str(without))
    assert info["source"] == ".eh_frame (no search table)", info
    assert info["fdes"] == _native.cfi_rows(str(with_table))[1]["fdes"] > 3
    assert rules(without) == rules(with_table)


def test_slots_patched_and_restored_by_the_hook_library(tmp_path):
    """The one owner of the slot rules (hook_library/slots.h), in-process: of a plan of five
    slots, the one holding the real function, the lazily bound one (in its PLT) and the one in
    a read-only page are patched; someone else's is left alone, and one whose page is gone is
    said unreadable, never read. At detach every slot holding its hook gets its original back,
    and one the program wrote meanwhile is left as it is."""
    import harness
    from memhook import _native
    stdout, _ = harness.run(tmp_path, "slots_harness.cpp")
    lines = stdout.splitlines()
    said = dict(line.split(None, 1) for line in lines if not line.startswith(("patched",
                                                                             "stopped")))
    hook, real = (int(x, 16) for x in said["hook"].split()[::2])
    # (memhook_patch also patches, as late slots, the objects memhook did not plan: here the
    # harness's own libraries, as no object was listed known)
    assert said["start"] == "0" and int(said["patch"]) >= 0

    def slots(step):
        rows = [line.split() for line in lines if line.startswith(step + " ")]
        return [(int(r[3]), int(r[5], 16), int(r[7], 16)) for r in rows]

    S = _native.SLOT_STATES
    assert slots("patched") == [
        (S["patched"], hook, real),              # bound to the real function
        (S["patched"], hook, 0x10030),           # lazy: its PLT address kept as the original
        (S["skipped"], 0xDEAD0000, 0xDEAD0000),  # someone else's
        (S["unreadable"], 0, real),              # its page is gone
        (S["patched"], hook, real),              # read-only: through mprotect
    ]
    assert int(said["stop"]) == 2 + int(said["patch"])  # the late ones restored too
    assert slots("stopped") == [
        (S["restored"], real, real), (S["patched"], 0x1234, 0x10030),
        (S["skipped"], 0xDEAD0000, 0xDEAD0000), (S["unreadable"], 0, real),
        (S["restored"], real, real)]


@pytest.mark.parametrize("cpu", ["max", "cortex-a57"])
def test_the_aarch64_syscall_stub_puts_every_register_back(tmp_path, cpu):
    """The leak check's stub on AArch64 (arch/aarch64/syscall_stub.S), entered as memhook has a
    stopped thread enter it but without ptrace (qemu-user has none): after its call it returns,
    through rt_sigreturn, with every general register, sp, pc and the flags call_regs holds,
    the FP/SIMD registers, signal mask and alternate stack as they were, and says so."""
    import harness
    stdout, _ = harness.run(tmp_path, "stub_harness_a64.cpp", aarch64_cpu=cpu)
    assert "bad 0" in stdout and stdout.count(" ok") == 39, stdout
