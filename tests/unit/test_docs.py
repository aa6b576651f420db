"""The front door (issue 42): the README is a page of purpose and use under 250 lines, with
the two Quick start commands CI runs; the docs build into a site with no broken link or anchor
(`mkdocs build --strict`); each command's --help fits one screen and names its page."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCREEN = 50  # lines


def test_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 250
    quick = text.split("## Quick start", 1)[1]
    assert "scripts/demo.sh" in quick and "scripts/test.sh" in quick
    # every page it points to exists
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link


def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                        str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site" / "install" / "index.html").is_file()
    # every page of docs/ is in the site's navigation
    nav = (REPO / "mkdocs.yml").read_text()
    for page in (REPO / "docs").glob("*.md"):
        assert page.name in nav, page.name


@pytest.mark.parametrize("command", [[], ["report"], ["run"], ["snapshot"], ["trim"]])
def test_help_fits_one_screen(command):
    r = subprocess.run([sys.executable, "-m", "memhook", *command, "--help"], capture_output=True,
                       text=True, env=dict(os.environ, COLUMNS="100"), cwd="/")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) <= SCREEN, len(lines)
    assert max(map(len, lines)) <= 100
    page = re.search(r"(docs/[\w-]+\.md)", r.stdout)
    assert page and (REPO / page.group(1)).is_file(), r.stdout[-300:]
