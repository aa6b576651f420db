"""A wheel against a source build (issue 42): each wheel's size, the time to install it into a
fresh venv (its dependencies from the package index, pip's cache warm after the first), and the
first `memhook -p` from it against the source build in .venv: the attach pause and the 16 B
malloc ratio, the two installs alternating on one target.

    sudo .venv/bin/python benchmarks/wheel.py [--cycles 5] [--python 3.11]
"""
import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from driver import Session, Target, build

REPO = Path(__file__).resolve().parents[1]


def install(version: str, venv: Path) -> tuple[str, float]:
    """A venv of pyenv's CPython `version` with the wheel installed; the wheel and seconds."""
    base = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python3"))[-1]
    tag = version.replace(".", "")
    whl = sorted(REPO.glob(f"wheelhouse/memhook_profiler-*-cp{tag}-*.whl"))[-1]
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    t0 = time.monotonic()
    subprocess.run([str(venv / "bin/pip"), "install", "-q", str(whl)], check=True)
    return str(whl), time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--python", default="3.11", help="the pyenv CPython of the wheel to compare")
    a = ap.parse_args()
    for whl in sorted(REPO.glob("wheelhouse/*.whl")):
        print(f"{whl.name}: {os.path.getsize(whl) / 1e6:.2f} MB")
    tmp = Path(tempfile.mkdtemp())
    for version in ("3.9", "3.10", "3.11", "3.12", "3.13"):
        _, seconds = install(version, tmp / f"v{version}")
        print(f"install into a new venv, CPython {version}: {seconds:.1f} s")
    wheel_python = str(tmp / f"v{a.python}" / "bin/python")
    source_python = str(REPO / ".venv/bin/python")
    t = Target(build("alloc_latency", tmp))
    figures = {"source": {"pause": [], "ratio": []}, "wheel": {"pause": [], "ratio": []}}
    installs = [("source", source_python), ("wheel", wheel_python)]
    for cycle in range(a.cycles):
        for name, python in installs[::1 if cycle % 2 else -1]:  # each goes first in turn
            mh = Session(t.pid, python=python)
            got = t.answers("pair 16 100000 5 0")
            mh.stop()
            figures[name]["pause"].append(mh.attach_ms)
            figures[name]["ratio"].append(got["ns"] / got["bare"])
    assert t.close() == 0
    for name, f in figures.items():
        print(f"{name:>6}: attach pause {statistics.median(f['pause']):.1f} ms "
              f"({min(f['pause']):.1f}-{max(f['pause']):.1f}); 16 B ratio "
              f"{statistics.median(f['ratio']):.2f}x ({min(f['ratio']):.2f}-"
              f"{max(f['ratio']):.2f}), {a.cycles} cycles alternating")


if __name__ == "__main__":
    sys.exit(main())
