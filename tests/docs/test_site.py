"""The documentation site (mkdocs.yml, built by ``make docs``): every page is in its nav; the reference has an entry for
every public name, on the page of the module users import it from, and nothing twice; the guides link the first
mention of each main API to its entry. Where mkdocs is installed (``make docs`` installs it in ``.venv-docs``), the
site builds with ``--strict`` and is checked as a reader sees it: the docstrings' examples as code, readers documented
as ``jaxstow.open`` returns them, the docstrings' guides and Sphinx roles as links."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
_NAV_ENTRY = re.compile(r"^\s*- (?:[^:]+: )?\"?([\w./-]+\.md)\"?\s*$")

#: Each public module and the page of the reference where its names have their entries.
FACES = {
    "jaxstow": "api/jaxstow.md",
    "jaxstow.checkpoint": "api/checkpoint.md",
    "jaxstow.huggingface": "api/huggingface.md",
    "jaxstow.io": "api/io.md",
    "jaxstow.train": "api/train.md",
    "jaxstow.objax": "api/objax.md",
    "jaxstow.flarejax": "api/flarejax.md",
    "jaxstow.errors": "api/errors.md",
}

#: The main APIs, as the guides mention them, and their entries in the reference.
MAIN_APIS = {
    "jaxstow.save": "jaxstow.save",
    "jaxstow.load": "jaxstow.load",
    "jaxstow.load_metadata": "jaxstow.load_metadata",
    "jaxstow.open": "jaxstow.open",
    "jaxstow.huggingface.load": "jaxstow.huggingface.load",
    "jaxstow.huggingface.open": "jaxstow.huggingface.open",
    "CheckpointManager": "jaxstow.CheckpointManager",
    "KeepPolicy": "jaxstow.KeepPolicy",
    "LocalTier": "jaxstow.LocalTier",
    "Transfer": "jaxstow.Transfer",
    "saveable": "jaxstow.saveable",
    "export_safetensors": "jaxstow.export_safetensors",
    "Reader": "jaxstow.Reader",
    "io.save": "jaxstow.io.save",
    "io.no_save": "jaxstow.io.no_save.no_save",
    "MemoryCollector": "jaxstow.io.MemoryCollector",
    "HDF5Collector": "jaxstow.io.HDF5Collector",
    "run_chains": "jaxstow.io.run_chains",
    "to_inference_data": "jaxstow.io.to_inference_data",
    "TreeCheckpoint": "jaxstow.objax.TreeCheckpoint",
    "DefaultCheckpointer": "jaxstow.train.DefaultCheckpointer",
    "Trainer": "jaxstow.train.Trainer",
    "StorageError": "jaxstow.errors.StorageError",
}


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
    assert {"index.md", "format.md", "architecture.md", "benchmarks.md", *FACES.values()} <= set(listed)


def test_a_page_missing_from_the_nav_is_found():
    config = "site_name: x\nnav:\n  - Home: index.md\n  - Guides:\n      - One: one.md\n  - 'api/io.md'\n"
    assert nav(config) == ["index.md", "one.md"]
    assert nav(config + '  - "jaxstow.io": api/io.md\n') == ["index.md", "one.md", "api/io.md"]


# -- the reference, read from its pages' source ------------------------------------------------------------------------

_DIRECTIVE = re.compile(r"^::: ([\w.]+)\n((?: {4}.*\n)*)", re.M)
_MEMBERS = re.compile(r"^ {6}members: *(.*)\n((?: {8}- .*\n)*)", re.M)
_ANCHOR = re.compile(r'<span id="([\w.]+)"></span>')


def directives(text: str) -> list[tuple[str, list[str] | bool]]:
    """Each ``::: target`` of an API page and the members it renders: a list, ``False`` for none, ``True`` for all."""
    found = []
    for target, options in _DIRECTIVE.findall(text):
        members = _MEMBERS.search(options)
        if members is None:
            found.append((target, True))
        elif members[1].strip() == "false":
            found.append((target, False))
        else:
            listed = members[1].strip().strip("[]") or ",".join(line.strip()[2:] for line in members[2].splitlines())
            found.append((target, [name.strip() for name in listed.split(",") if name.strip()]))
    return found


def find(path: str) -> Any:
    """The object at a dotted path, importing the longest module prefix (``jaxstow.io.no_save.no_save``)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def entries(text: str) -> set[str]:
    """The entries an API page has, by the path they are found under: each rendered object, each member it renders (a
    module rendered whole renders its ``__all__``), and each anchor of a table row."""
    paths = set(_ANCHOR.findall(text))
    for target, members in directives(text):
        paths.add(target)
        if members is True and isinstance(find(target), types.ModuleType):
            members = list(find(target).__all__)
        paths.update(f"{target}.{name}" for name in (members if isinstance(members, list) else []))
    return paths


def rendered_objects(text: str) -> list[Any]:
    """The classes and functions whose documentation an API page renders in full."""
    found = []
    for target, members in directives(text):
        obj = find(target)
        if isinstance(obj, types.ModuleType):
            names = obj.__all__ if members is True else members or []
            found.extend(getattr(obj, name) for name in names)
        else:
            found.append(obj)
    return [obj for obj in found if inspect.isclass(obj) or inspect.isfunction(obj)]


def has_member(obj: Any, name: str) -> bool:
    """Whether ``obj`` has ``name``, also as an attribute its instances get in a method (``self.name = ...``)."""
    if hasattr(obj, name):
        return True
    classes = [cls for cls in getattr(obj, "__mro__", ()) if cls.__module__.startswith("jaxstow")]
    return any(re.search(rf"\bself\.{name}\b[^=\n]*=", inspect.getsource(cls)) for cls in classes)


def test_the_api_pages_render_objects_and_members_that_exist():
    for page in sorted((DOCS / "api").glob("*.md")):
        for target, members in directives(page.read_text()):
            obj = find(target)
            for member in members if isinstance(members, list) else []:
                assert has_member(obj, member), f"{page.name}: {target} has no {member}"
    assert has_member(find("jaxstow.Reader"), "metadata") and not has_member(find("jaxstow.Reader"), "meta")


def test_every_public_name_has_an_entry_on_its_modules_page():
    for module, page in FACES.items():
        found = entries((DOCS / page).read_text())
        missing = [name for name in importlib.import_module(module).__all__ if f"{module}.{name}" not in found]
        assert missing == [], f"{page} has no entry for these names of {module}: {missing}"


def test_no_object_is_documented_in_full_twice():
    seen: dict[int, str] = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        for obj in rendered_objects(page.read_text()):
            where = f"{page.name}: {obj.__module__}.{obj.__qualname__}"
            assert id(obj) not in seen, f"documented twice: {seen[id(obj)]} and {where}"
            seen[id(obj)] = where


def test_a_name_without_an_entry_and_an_object_documented_twice_are_found():
    page = (
        "::: jaxstow.io\n    options:\n      members: false\n\n::: jaxstow.io.save\n\n"
        "::: jaxstow.io.scheduler\n\n::: jaxstow.errors\n    options:\n      members:\n        - StorageError\n"
        '        - SliceError\n\n| `x` | y |\n| <span id="jaxstow.io.Saving"></span>`jaxstow.io.Saving` | z |\n'
    )
    assert directives(page) == [
        ("jaxstow.io", False),
        ("jaxstow.io.save", True),
        ("jaxstow.io.scheduler", True),
        ("jaxstow.errors", ["StorageError", "SliceError"]),
    ]
    found = entries(page)
    assert {"jaxstow.io.save", "jaxstow.io.Saving", "jaxstow.io.scheduler.static_information"} <= found
    assert "jaxstow.io.no_save" not in found and "jaxstow.errors.ArgumentError" not in found
    twice = page + "\n::: jaxstow.io.CollectorError\n\n::: jaxstow.errors.SliceError\n"
    objects = [id(obj) for obj in rendered_objects(twice)]
    assert len(objects) == len(set(objects)) + 1  # SliceError; CollectorError is another class


# -- the guides link to the reference ------------------------------------------------------------------------------------

_FENCE = re.compile(r"^```.*?^```$", re.S | re.M)
_SPAN = re.compile(r"(\[?)`([^`\n]+)`(\]\[[\w.]+\])?")
#: A code span after these words names another library's object (orbax's ``CheckpointManager``), not jaxstow's.
_FOREIGN = ("orbax's ",)


def _mentions(span: str, name: str) -> bool:
    text = re.sub(r"^@|^(?:keep|local|transfer)=", "", span)
    if not name.startswith("jaxstow."):
        text = text.removeprefix("jaxstow.")
    if not name.startswith(("jaxstow.", "io.")):
        text = text.removeprefix("io.")
    rest = text[len(name) :]
    return text.startswith(name) and (rest == "" or rest[0] == "(" or re.match(r"\.[a-z_]+\b", rest) is not None)


def unlinked_first_mentions(text: str) -> list[str]:
    """The main APIs whose first mention in the page's prose (outside code blocks and headings) is no link to their
    entry in the reference."""
    prose = "\n".join(line for line in _FENCE.sub("", text).splitlines() if not line.startswith("#"))
    unlinked, seen = [], set()
    for found in _SPAN.finditer(prose):
        if prose[: found.start()].endswith(_FOREIGN):
            continue
        for name, entry in MAIN_APIS.items():
            if name in seen or not _mentions(found[2], name):
                continue
            seen.add(name)
            if not (found[1] and found[3] and found[3][2:-1].startswith(entry)):
                unlinked.append(f"{name} (`{found[2]}`)")
    return unlinked


def test_each_guide_links_its_first_mention_of_each_main_api_to_the_reference():
    guides = [page for page in nav(CONFIG.read_text()) if not page.startswith("api/")]
    assert {page: unlinked_first_mentions((DOCS / page).read_text()) for page in guides} == {
        page: [] for page in guides
    }


def test_a_first_mention_that_is_no_link_is_found():
    page = (
        "# `jaxstow.save`\n\nAs orbax's `CheckpointManager` does, [`CheckpointManager(...)`][jaxstow.CheckpointManager]"
        " keeps steps; `jaxstow.save(path, tree)` and [`io.save`][jaxstow.io.save] save, `CheckpointManager` too.\n\n"
        "```python\njaxstow.load(path)\n```\n[`Reader.read`][jaxstow.Reader.read] and `jaxstow.load`; "
        "[`KeepPolicy`][jaxstow.LocalTier].\n"
    )
    assert unlinked_first_mentions(page) == [
        "jaxstow.save (`jaxstow.save(path, tree)`)",
        "jaxstow.load (`jaxstow.load`)",
        "KeepPolicy (`KeepPolicy`)",
    ]


# -- the site as a reader sees it ----------------------------------------------------------------------------------------


def _mkdocs() -> str | None:
    """A Python that runs mkdocs with the site's plugins: this one, or the venv ``make docs`` builds."""
    for python in (sys.executable, str(ROOT / ".venv-docs" / "bin" / "python")):
        check = "import mkdocs, material, mkdocstrings_handlers.python"
        if Path(python).exists() and subprocess.run([python, "-c", check], capture_output=True).returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = _mkdocs()
    if python is None:
        pytest.skip("mkdocs and its plugins are not installed here (make docs, or pip install 'jaxstow[docs]')")
    folder = tmp_path_factory.mktemp("site") / "site"
    built = subprocess.run(
        [python, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=280,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return folder


def html(site: Path, page: str) -> str:
    return (site / page.removesuffix(".md").removesuffix("index") / "index.html").read_text()


def entry(page: str, path: str) -> str:
    """The HTML of one entry of an API page: from its heading to the next heading of its level or above."""
    start = page.index(f'id="{path}"')
    level = page[page.rindex("<h", 0, start) + 2]
    end = re.compile(rf"<h[1-{level}] ").search(page, start)
    return page[start : end.start() if end else len(page)]


@pytest.mark.timeout(300)
def test_the_site_builds_strictly_with_the_docstrings_examples_as_code(site):
    io_page = html(site, "api/io.md")
    assert 'id="jaxstow.io.to_datatree"' in io_page
    assert "language-pycon" in io_page and ":func:`" not in io_page
    for page in pages():
        assert (site / page.removesuffix(".md").removesuffix("index") / "index.html").exists(), page


def test_every_public_name_is_an_entry_of_its_modules_page_on_the_site(site):
    for module, page in FACES.items():
        ids = set(re.findall(r'id="([^"]+)"', html(site, page)))
        missing = [name for name in importlib.import_module(module).__all__ if f"{module}.{name}" not in ids]
        assert missing == [], f"{page} shows no entry for these names of {module}: {missing}"
    for page in FACES.values():
        private = [path for path in re.findall(r'<h\d id="([^"]+)"', html(site, page)) if "._" in path]
        assert private == [], f"{page} documents private paths: {private}"


def test_a_reader_is_documented_as_open_returns_it(site):
    reader = entry(html(site, "api/jaxstow.md"), "jaxstow.Reader")
    for internal in ("containers", "Container", "OpenedFile", "leaves:", "Bases"):
        assert internal not in reader
    for member in ("load", "read", "info", "abstract", "metadata", "close"):
        assert f'id="jaxstow.Reader.{member}"' in reader
    assert "self.container" not in reader  # an attribute's value as __init__ computes it
    assert 'href="#jaxstow.open"' in reader


def test_the_new_settings_and_errors_are_in_the_reference(site):
    page = html(site, "api/jaxstow.md")
    manager = entry(page, "jaxstow.CheckpointManager")
    for setting in ("keep", "local", "broadcast_restore"):
        assert f'id="jaxstow.CheckpointManager({setting})"' in manager or f"<code>{setting}</code>" in manager
    assert 'id="jaxstow.CheckpointManager.steps"' in manager and "Bases" not in manager  # inherited, no mixin
    transfer = entry(page, "jaxstow.Transfer")
    assert "<code>attempts</code>" in transfer and "<code>backoff</code>" in transfer
    errors = html(site, "api/errors.md")
    assert 'id="jaxstow.errors.StorageError"' in errors and 'id="jaxstow.errors.CheckpointStorageError"' in errors


def test_the_docstrings_guides_and_roles_are_links(site):
    for page in FACES.values():
        text = html(site, page)
        assert re.findall(r"docs/[\w-]+\.md", text) == [], page
        assert ":class:`" not in text and ":meth:`" not in text, page
    page = html(site, "api/jaxstow.md")
    assert '<a href="../../checkpointing/">Checkpointing a training run</a>' in page  # "docs/checkpointing.md"
    assert 'href="#jaxstow.Reader"' in entry(page, "jaxstow")  # ":class:`Reader`"
    assert 'href="../../checkpointing/#preemption"' in entry(page, "jaxstow.CheckpointManager")


def test_the_guides_link_to_the_reference(site):
    guide = html(site, "checkpointing.md")
    for name in ("CheckpointManager", "KeepPolicy", "LocalTier", "save", "load"):
        assert f'href="../api/jaxstow/#jaxstow.{name}"' in guide, name
    assert 'href="../api/io/#jaxstow.io.no_save.no_save"' in html(site, "sampling.md")
