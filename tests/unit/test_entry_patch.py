"""The entry-patch planner (issue 32) on functions of known shapes (tests/unit/native/
entry_shapes.S): how many bytes it moves, its refusals, and its relocation, checked by decoding
the trampoline it writes."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from iced_x86 import Decoder, FlowControl

from memhook import entry_patch

NATIVE = Path(__file__).parent / "native"
FAR = 0x7000_0000  # the cell: far enough that every rel8/rel32 must be re-encoded


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """name -> (address, size, bytes) of each function in the shared object built from
    entry_shapes.S, at its link-time addresses."""
    so = tmp_path_factory.mktemp("entry") / "shapes.so"
    subprocess.run(["gcc", "-shared", "-nostdlib", str(NATIVE / "entry_shapes.S"), "-o",
                    str(so)], check=True)
    out = {}
    with open(so, "rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text")
        code = text.data()
        for s in elf.get_section_by_name(".symtab").iter_symbols():
            if s["st_info"]["type"] == "STT_FUNC" and s["st_size"]:
                at = s["st_value"] - text["sh_addr"]
                out[s.name] = (s["st_value"], s["st_size"],
                               code[at:at + max(s["st_size"], entry_patch.MAX_ORIGINAL)])
        data = elf.get_section_by_name(".data")
        out["table"] = data["sh_addr"]
    return out


def planned(shapes, name):
    address, size, body = shapes[name]
    return entry_patch.plan(name, 1, address, size, body, address + FAR)


def trampoline(p):
    return list(Decoder(64, p.trampoline, ip=p.trampoline_address))


def test_moves_whole_instructions_and_jumps_back(shapes):
    p = planned(shapes, "framed")
    assert p.length == 8  # push (1), mov (3), sub (4): the first whole instructions >= 5 bytes
    insns = trampoline(p)
    assert [str(i) for i in insns[:3]] == ["push rbp", "mov rbp,rsp", "sub rsp,20h"]
    assert insns[-1].flow_control == FlowControl.UNCONDITIONAL_BRANCH
    assert insns[-1].near_branch_target == p.address + 8
    assert p.original[:8] == shapes["framed"][2][:8]
    assert len(p.trampoline) + entry_patch.STUB <= entry_patch.CELL


def test_rip_relative_operand_still_reads_the_same_address(shapes):
    p = planned(shapes, "rip_relative")
    first = trampoline(p)[0]
    assert first.is_ip_rel_memory_operand
    assert first.ip_rel_memory_address == shapes["table"]  # from 1.75 GiB away


def test_short_branch_relocated_to_its_old_target(shapes):
    p = planned(shapes, "short_jump_first")
    address, size, body = shapes["short_jump_first"]
    was = next(i for i in Decoder(64, body[:size], ip=address)
               if i.flow_control == FlowControl.CONDITIONAL_BRANCH)
    insns = trampoline(p)
    branch = next(i for i in insns if i.flow_control == FlowControl.CONDITIONAL_BRANCH)
    assert was.len == 2 and branch.len == 6  # rel8 became rel32: the trampoline is far away
    assert branch.near_branch_target == was.near_branch_target == address + 11  # `2:`


def test_branch_into_the_patched_bytes_refused(shapes):
    with pytest.raises(entry_patch.Refused, match="lands inside"):
        planned(shapes, "loops_to_its_start")


def test_branch_back_from_a_cold_part_refused(shapes):
    """GCC splits rarely run code into `name.cold`, which jumps back into the function's body:
    a jump into the bytes the patch replaces is refused from there too."""
    address, size, body = shapes["hot_with_cold_part"]
    entry_patch.plan("hot_with_cold_part", 1, address, size, body, address + FAR)  # alone: fine
    cold, n, code = shapes["hot_with_cold_part.cold"]
    with pytest.raises(entry_patch.Refused, match="lands inside"):
        entry_patch.plan("hot_with_cold_part", 1, address, size, body, address + FAR,
                         [(cold, code[:n])])


def test_too_short_refused(shapes):
    with pytest.raises(entry_patch.Refused, match="shorter than"):
        planned(shapes, "tiny")


def test_area_within_reach_of_every_function():
    from memhook.common.procfs import Mapping
    maps = [Mapping(0x5555_0000_0000, 0x5555_0010_0000, "r-xp", 0, 1, "/exe"),
            Mapping(0x5555_0010_0000, 0x5555_0020_0000, "rw-p", 0, 1, "/exe"),
            Mapping(0x7fff_0000_0000, 0x7fff_0010_0000, "r-xp", 0, 2, "/lib")]
    at = entry_patch.area_address(maps, [0x5555_0000_1000], 4096)
    assert at == 0x5555_0020_0000  # the gap right above the executable
    assert entry_patch.area_address(maps[:1], [0x5555_0000_1000], 4096) == 0


def test_a_function_without_a_size_is_scanned_as_far_as_its_call_frame_entry(tmp_path):
    """An assembly function that declares no size: the branch scan covers what its .eh_frame
    entry covers, so a loop back into the patched bytes from beyond the first 32 is refused."""
    so = tmp_path / "shapes.so"
    subprocess.run(["gcc", "-shared", "-nostdlib", str(NATIVE / "entry_shapes.S"), "-o",
                    str(so)], check=True)
    with open(so, "rb") as f:
        elf = ELFFile(f)
        found, _ = entry_patch._symbols(elf, {"unsized_loops_back"})
        address, size = found["unsized_loops_back"]
        assert size == 2 + 40 + 3 + 2 + 1  # nops, fill, dec, jnz rel8, ret
        text = elf.get_section_by_name(".text")
        body = text.data()[address - text["sh_addr"]:][:size]
    with pytest.raises(entry_patch.Refused, match="lands inside"):
        entry_patch.plan("unsized_loops_back", 1, address, size, body, address + FAR)


# AArch64 (issue 46): the planner's relocation of each instruction that reads the PC, run. The
# shapes (native/entry_shapes_a64.S) are cross-built into a static harness with their
# trampolines, which qemu-user runs with pointer authentication on (its "max" CPU): every shape
# must return the same directly and through its trampoline.
A64_SHAPES = ["adrp", "adr", "ldr", "ldrsw", "ldr_w", "ldr_d", "b", "cbz", "tbnz", "bcond",
              "plain", "pac", "bti"]


@pytest.fixture(scope="module")
def a64_harness(tmp_path_factory):
    out = tmp_path_factory.mktemp("a64") / "harness"
    subprocess.run(["aarch64-linux-gnu-gcc", "-static", "-no-pie", "-O1", "-march=armv8.5-a",
                    str(NATIVE / "entry_harness_a64.c"), str(NATIVE / "entry_shapes_a64.S"),
                    "-o", str(out)], check=True)
    with open(out, "rb") as f:
        elf = ELFFile(f)
        symbols = {s.name: s["st_value"] for s in elf.get_section_by_name(".symtab").iter_symbols()
                   if s.name.startswith("shape_")}
        text = elf.get_section_by_name(".text")
        data, base = text.data(), text["sh_addr"]
    return out, {n: (a, data[a - base:a - base + 64]) for n, a in symbols.items()}


def a64_plan(shapes, name, cell):
    from memhook.entry_patch import a64 as entry_a64
    address, body = shapes[f"shape_{name}"]
    return entry_a64.plan(name, address, 0, body, cell)


def test_a64_trampolines_do_what_the_entries_did(tmp_path, a64_harness):
    exe, shapes = a64_harness
    lines, moved = [], {}
    for i, name in enumerate(A64_SHAPES):
        cell = 0x4000000 + 128 * i
        at, length, code = a64_plan(shapes, name, cell)
        moved[name] = at - shapes[f"shape_{name}"][0]
        lines.append(f"{name} {cell:x} {code.hex()}")
    (tmp_path / "trampolines").write_text("\n".join(lines) + "\n")
    out = subprocess.run(["qemu-aarch64-static", "-cpu", "max", str(exe),
                          str(tmp_path / "trampolines")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    results = [line.split() for line in out.splitlines()]
    assert sorted({r[0] for r in results}) == sorted(A64_SHAPES), out
    assert all(direct == through for _, direct, through in results), out
    assert {r[1] for r in results if r[0] == "bcond"} == {"5", "6"}  # (both ways taken)
    # landing pads stay where they are: the instruction after them moves
    assert moved == {n: 4 if n in ("pac", "bti") else 0 for n in A64_SHAPES}


def test_a64_branch_onto_the_moved_instruction_refused(a64_harness):
    from memhook.entry_patch import a64 as entry_a64
    with pytest.raises(entry_a64.Unrelocatable, match="lands on the instruction"):
        a64_plan(a64_harness[1], "loop", 0x4000000)
