"""The allocator struct CPython's PyObject_Malloc calls through, found from its first
instructions (memhook/inject/python_interpreter.py: iced-x86 on x86-64, capstone on AArch64),
in code the compiler made for both processors, reaching _PyRuntime through the GOT (a shared
libpython) and directly (an executable)."""
from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

from memhook.common import arch
from memhook.inject import python_interpreter

SOURCE = Path(__file__).parents[1] / "targets" / "python" / "allocator_shapes.c"
COMPILER = {"x86_64": "gcc", "aarch64": "aarch64-linux-gnu-gcc"}
SHAPES = {"shared": ["-shared", "-fPIC"], "executable": ["-fPIE", "-pie"]}
RELATIVE = {"EM_X86_64": 8, "EM_AARCH64": 1027}  # R_*_RELATIVE: the addend alone


class Image:
    """A linked object's memory as the loader would leave it at bias 0: its PT_LOAD segments
    (each to its page's end), with its dynamic relocations applied (RELATIVE: the addend; the others: the symbol's
    value plus the addend, every symbol this object's own)."""

    def __init__(self, path: Path):
        self.data = {}
        with open(path, "rb") as f:
            e = ELFFile(f)
            self.machine = e["e_machine"]
            for seg in e.iter_segments():
                if seg["p_type"] == "PT_LOAD":  # (mapped to its page's end, as mmap does)
                    end = -(-(seg["p_vaddr"] + seg["p_memsz"]) // 4096) * 4096
                    self.data[seg["p_vaddr"]] = bytearray(
                        seg.data().ljust(end - seg["p_vaddr"], b"\0"))
            for sec in e.iter_sections():
                if not isinstance(sec, RelocationSection) or not sec.is_RELA():
                    continue
                symbols = e.get_section(sec["sh_link"])
                for r in sec.iter_relocations():
                    value = r["r_addend"]
                    if r["r_info_type"] != RELATIVE[self.machine] and r["r_info_sym"]:
                        value += symbols.get_symbol(r["r_info_sym"])["st_value"]
                    self._write(r["r_offset"], struct.pack("<Q", value & (2**64 - 1)))
            self.symbols = {s.name: s["st_value"] for s in e.get_section_by_name(".symtab")
                            .iter_symbols() if s.name}
        self.text = (min(self.data), max(a + len(b) for a, b in self.data.items()))

    def _where(self, at: int, n: int):
        for start, body in self.data.items():
            if start <= at and at + n <= start + len(body):
                return body, at - start
        raise OSError(f"{at:#x} is not mapped")

    def _write(self, at: int, data: bytes):
        body, off = self._where(at, len(data))
        body[off:off + len(data)] = data

    def read(self, at: int, n: int) -> bytes:
        body, off = self._where(at, n)
        return bytes(body[off:off + n])

    def u64(self, at: int) -> int:
        return struct.unpack("<Q", self.read(at, 8))[0]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("machine", COMPILER)
def test_the_struct_is_found_from_pyobject_mallocs_code(tmp_path, monkeypatch, machine, shape):
    out = tmp_path / f"shapes-{machine}-{shape}"
    subprocess.run([COMPILER[machine], "-O2", "-g", *SHAPES[shape], str(SOURCE), "-o", str(out)],
                   check=True, capture_output=True)
    monkeypatch.setattr(arch, "HOST", arch.AARCH64 if machine == "aarch64" else arch.X86_64)
    image = Image(out)
    runtime = image.symbols["_PyRuntime"]
    found = python_interpreter.allocator_struct(image.symbols["PyObject_Malloc"], image,
                                                image.text)
    # _PyRuntime's `obj`: five words in, after `mem`
    assert found == runtime + 8 * (5 + 5), (hex(found), hex(runtime))
