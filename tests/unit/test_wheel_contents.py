"""What each built wheel (scripts/wheels.sh) holds, read from its ELF files (issue 42): nothing
needs a glibc symbol version above its manylinux tag's 2.17 nor GLIBC_PRIVATE, no library outside
the manylinux policy's (so no libdw, libelf, libz or libstdc++ of the build host), no RPATH or
RUNPATH, and the hook libraries injected into targets need no libstdc++ (no GLIBCXX, no
CXXABI), the glibc one its baseline's libraries, the musl one nothing (musl's libc is its
loader). `auditwheel show` reads every wheel (it failed on a musl library that named libc.so).
Wheels for x86-64 and for AArch64 (scripts/wheels.sh --arch aarch64), each with both libraries."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from test_libc_baseline import BASELINE, glibc_version

WHEELHOUSE = Path(os.environ.get("MEMHOOK_WHEELHOUSE",
                                 Path(__file__).resolve().parents[2] / "wheelhouse"))
# manylinux_2_17's libraries (PEP 599's list), those the wheel's files may need
POLICY = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
          "libgcc_s.so.1"}
LOADER = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}
WHEELS = sorted(WHEELHOUSE.glob("memhook_profiler-*.whl"))


def processor(whl: Path) -> str:
    return whl.name.rsplit("manylinux_2_17_", 1)[-1].removesuffix(".whl")


def elf_files(whl: Path) -> dict:
    with zipfile.ZipFile(whl) as z:
        return {n: z.read(n) for n in z.namelist() if z.read(n)[:4] == b"\x7fELF"}


def dynamic(data: bytes) -> tuple[set, set, list]:
    """(needed, required versions, rpaths) of one ELF file."""
    e = ELFFile(io.BytesIO(data))
    tags = list(e.get_section_by_name(".dynamic").iter_tags())
    needed = {t.needed for t in tags if t.entry.d_tag == "DT_NEEDED"}
    rpaths = [t.entry.d_tag for t in tags if t.entry.d_tag in ("DT_RPATH", "DT_RUNPATH")]
    sec = e.get_section_by_name(".gnu.version_r")
    versions = {a.name for _, auxs in sec.iter_versions() for a in auxs} if sec else set()
    return needed, versions, rpaths


def test_wheels_were_built():
    if not WHEELS and os.environ.get("MEMHOOK_REQUIRE_WHEELS") != "1":
        pytest.skip(f"no wheels in {WHEELHOUSE}: scripts/wheels.sh builds them")
    assert WHEELS, f"no wheels in {WHEELHOUSE}"
    for whl in WHEELS:
        assert processor(whl) in LOADER, whl.name


@pytest.mark.parametrize("whl", WHEELS, ids=lambda p: p.name.split("-")[2])
def test_wheel_elf_files(whl):
    files = elf_files(whl)
    arch = processor(whl)
    assert "memhook/libmemhook_hook.so" in files
    assert "memhook/musl/libmemhook_hook.so" in files, sorted(files)
    machine = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}[arch]
    assert any(n.startswith("memhook/_native.") for n in files), sorted(files)
    for name, data in files.items():
        needed, versions, rpaths = dynamic(data)
        assert ELFFile(io.BytesIO(data))["e_machine"] == machine, name
        assert not rpaths, (name, rpaths)
        if name.startswith("memhook/musl/"):
            assert needed == set(), needed
            assert not versions, versions
            continue
        assert needed <= POLICY | {LOADER[arch]}, (name, needed - POLICY)
        glibc = {v for v in versions if v.startswith("GLIBC_")}
        assert "GLIBC_PRIVATE" not in glibc, name
        above = {v for v in glibc if glibc_version(v) > BASELINE}
        assert not above, (name, sorted(above))
        if "libmemhook_hook" in name:
            assert not {v for v in versions if v.startswith(("GLIBCXX", "CXXABI"))}, name


@pytest.mark.parametrize("whl", WHEELS, ids=lambda p: p.name.split("-")[2])
def test_auditwheel_show(whl):
    auditwheel = shutil.which("auditwheel") or "/var/cache/memhook-wheels/tools/bin/auditwheel"
    if not os.path.exists(auditwheel):
        pytest.skip("no auditwheel (scripts/wheels.sh installs it)")
    r = subprocess.run([auditwheel, "show", str(whl)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-800:]
    assert ('is consistent with the following platform tag:\n'
            f'"manylinux_2_17_{processor(whl)}"') in r.stdout, r.stdout
