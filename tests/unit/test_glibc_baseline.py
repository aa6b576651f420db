"""The hook library loads into any glibc from 2.17 on (issue 31, point 1): no symbol it imports
needs a newer version, none is GLIBC_PRIVATE, and the libraries that held dlopen and the
pthread functions before glibc 2.34 are named as needed."""
from __future__ import annotations

from importlib import resources

from elftools.elf.elffile import ELFFile

from memhook import elf

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
