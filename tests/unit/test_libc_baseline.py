"""The hook library loads into any glibc from 2.17 on (issue 31, point 1): no symbol it imports
needs a newer version, none is GLIBC_PRIVATE, and the libraries that held dlopen and the
pthread functions before glibc 2.34 are named as needed. Its musl build needs musl's libc
alone. A libc's version is read from its file, and one below the baseline refused in one line."""
from __future__ import annotations

import os
import platform
from importlib import resources

import pytest
from elftools.elf.elffile import ELFFile

from memhook.elf import slots as elf

BASELINE = (2, 17)


def version_needs(path) -> dict[str, set[str]]:
    """.gnu.version_r: each needed file and the versions required from it."""
    with open(path, "rb") as f:
        e = ELFFile(f)
        sec = e.get_section_by_name(".gnu.version_r")
        return {verneed.name: {aux.name for aux in auxs} for verneed, auxs in sec.iter_versions()}


def glibc_version(name: str) -> tuple:
    return tuple(int(x) for x in name[len("GLIBC_"):].split("."))


def test_hook_library_needs_nothing_above_the_baseline():
    needs = version_needs(resources.files("memhook").joinpath(elf.HOOK_LIBRARY_NAME))
    versions = {v for vs in needs.values() for v in vs if v.startswith("GLIBC_")}
    assert "GLIBC_PRIVATE" not in versions
    above = {v for v in versions if glibc_version(v) > BASELINE}
    assert not above, f"needs {sorted(above)}: older glibc cannot load it ({needs})"


def test_hook_library_names_libdl_and_libpthread():
    with open(resources.files("memhook").joinpath(elf.HOOK_LIBRARY_NAME), "rb") as f:
        dynamic = ELFFile(f).get_section_by_name(".dynamic")
        needed = {t.needed for t in dynamic.iter_tags() if t.entry.d_tag == "DT_NEEDED"}
    assert {"libdl.so.2", "libpthread.so.0", "libc.so.6"} <= needed, needed


def test_libc_found_by_either_file_name():
    """The mapped libc is libc.so.6 since glibc 2.34 and libc-2.X.so before (Debian 11's
    libc-2.31.so, RHEL 8's libc-2.28.so)."""
    for path in ("/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libc-2.31.so",
                 "/srv/root/lib64/libc-2.28.so", "/lib64/libc-2.17.so"):
        assert elf.is_libc(path), path
    for path in ("/lib/x86_64-linux-gnu/libcap.so.2", "/usr/lib/libc++.so.1",
                 "/lib/x86_64-linux-gnu/libcrypt.so.1", "/usr/lib/libc.so.6.bak/x"):
        assert not elf.is_libc(path), path


def test_musl_build_needs_musl_libc_alone():
    path = resources.files("memhook").joinpath("musl", elf.HOOK_LIBRARY_NAME)
    if not path.is_file():
        pytest.skip("built without musl-gcc (scripts/setup.sh installs musl-tools)")
    with open(path, "rb") as f:
        e = ELFFile(f)
        needed = {t.needed for t in e.get_section_by_name(".dynamic").iter_tags()
                  if t.entry.d_tag == "DT_NEEDED"}
        strong = {s.name for s in e.get_section_by_name(".dynsym").iter_symbols()
                  if s["st_shndx"] == "SHN_UNDEF" and s.name
                  and s["st_info"]["bind"] == "STB_GLOBAL"}
    # None at all: musl's libc is its loader, always in the global scope (CMakeLists.txt), and
    # a needed libc.so made auditwheel read the build host's linker script.
    assert needed == set(), needed
    assert e.get_section_by_name(".gnu.version_r") is None
    assert not {n for n in strong if n.startswith(("_Unwind", "__gxx", "_ZN", "__cxa_"))}, strong


def test_libc_versions_read_from_the_files(tmp_path):
    assert elf.libc_version("glibc", "/lib/x86_64-linux-gnu/libc.so.6") == platform.libc_ver()[1]
    if os.path.exists("/usr/lib/x86_64-linux-musl/libc.so"):
        v = elf.libc_version("musl", "/usr/lib/x86_64-linux-musl/libc.so")
        assert v.startswith("1.") and v.count(".") == 2, v
    old = tmp_path / "libc-2.12.so"
    old.write_bytes(b"\0" * 64 + b"GNU C Library (GNU libc) stable release version 2.12, by "
                    b"Roland McGrath et al.\n" + b"\0" * 64)
    assert elf.libc_version("glibc", str(old)) == "2.12"
    problem = elf.baseline_problem("glibc", "2.12")
    assert problem == ("the target's glibc is 2.12; memhook's hook library needs glibc 2.17 or "
                       "newer"), problem
    musl = tmp_path / "ld-musl-x86_64.so.1"
    musl.write_bytes(b"\0musl libc (x86_64)\nVersion %s\n\0" + b"\x001.1.24\x00" + b"\0" * 8)
    assert elf.libc_version("musl", str(musl)) == "1.1.24"
    assert "musl 1.2 or newer" in elf.baseline_problem("musl", "1.1.24")
    for kind, version in (("glibc", "2.17"), ("glibc", "2.41"), ("musl", "1.2.3"), ("glibc", "")):
        assert elf.baseline_problem(kind, version) == "", (kind, version)
    assert elf.libc_version("glibc", str(tmp_path / "missing")) == ""
