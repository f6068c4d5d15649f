"""The documentation site (mkdocs.yml, built by ``make docs``): every page is in its nav, every API page renders
modules and members that exist, and the site builds with ``--strict`` where mkdocs is installed (``make docs``
installs it in ``.venv-docs``), its API pages showing the docstrings' examples as code."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
_NAV_ENTRY = re.compile(r"^\s*- (?:[^:]+: )?\"?([\w./-]+\.md)\"?\s*$")
_DIRECTIVE = re.compile(r"^::: ([\w.]+)(?:\n {4}options:\n {6}members: \[([^\]]*)\])?", re.M)


def nav(config: str) -> list[str]:
    """The pages the nav of a mkdocs.yml lists, in order."""
    section = config.split("\nnav:\n", 1)[1]
    return [found[1] for line in section.splitlines() if (found := _NAV_ENTRY.match(line))]


def pages() -> list[str]:
    """Every page under docs/, as mkdocs names it (``api/io.md``); the Griffe extension's folder holds none."""
    return sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))


def test_every_page_is_in_the_nav_once_and_every_entry_is_a_page():
    listed = nav(CONFIG.read_text())
    assert len(listed) == len(set(listed)), "a page is in the nav twice"
    assert sorted(listed) == pages()
    assert {"index.md", "format.md", "architecture.md", "benchmarks.md", "api/io.md"} <= set(listed)


def test_a_page_missing_from_the_nav_is_found():
    config = "site_name: x\nnav:\n  - Home: index.md\n  - Guides:\n      - One: one.md\n  - 'api/io.md'\n"
    assert nav(config) == ["index.md", "one.md"]
    assert nav(config + '  - "jaxstow.io": api/io.md\n') == ["index.md", "one.md", "api/io.md"]


def test_the_api_pages_render_modules_and_members_that_exist():
    rendered = set()
    for page in sorted((DOCS / "api").glob("*.md")):
        for module, members in _DIRECTIVE.findall(page.read_text()):
            imported = importlib.import_module(module)
            rendered.add(module)
            for member in filter(None, (name.strip() for name in members.split(","))):
                assert hasattr(imported, member), f"{page.name}: {module} has no {member}"
    faces = {"jaxstow", "jaxstow.checkpoint", "jaxstow.io", "jaxstow.train", "jaxstow.objax", "jaxstow.errors"}
    assert faces <= rendered


def _mkdocs() -> str | None:
    """A Python that runs mkdocs with the site's plugins: this one, or the venv ``make docs`` builds."""
    for python in (sys.executable, str(ROOT / ".venv-docs" / "bin" / "python")):
        check = "import mkdocs, material, mkdocstrings_handlers.python"
        if Path(python).exists() and subprocess.run([python, "-c", check], capture_output=True).returncode == 0:
            return python
    return None


@pytest.mark.timeout(300)
def test_the_site_builds_strictly_with_the_docstrings_examples_as_code(tmp_path):
    python = _mkdocs()
    if python is None:
        pytest.skip("mkdocs and its plugins are not installed here (make docs, or pip install 'jaxstow[docs]')")
    built = subprocess.run(
        [python, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=280,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    io_page = (tmp_path / "site" / "api" / "io" / "index.html").read_text()
    assert 'id="jaxstow.io.to_datatree"' in io_page
    assert "language-pycon" in io_page and ":func:`" not in io_page
    for page in pages():
        assert (tmp_path / "site" / page.removesuffix(".md").removesuffix("index") / "index.html").exists(), page
    shutil.rmtree(tmp_path / "site")
