"""Every block of every page of the documentation (README.md and docs/*.md) runs as written, in order, in a fresh
folder of the page's own; its console transcripts are what the commands print (``tests/support/docs_blocks.py`` says how a
page is run). ``JAXSTOW_DOCS_UPDATE=1`` (or ``JAXSTOW_README_UPDATE=1``) writes what they print into the pages
instead. A page is skipped, naming what it lacks, where a package it imports is missing or where the S3 server it
needs cannot start; the blocks that need more devices than there are are left out, and the page then ends skipped,
naming them. Every relative link of a page leads to a file, and a link to a heading to one that is there.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

import pytest
from docs_blocks import (
    OPT_OUT,
    PAGES,
    ROOT,
    UPDATE,
    Block,
    blocks,
    borrowed_from_device_blocks,
    buckets,
    devices,
    differences,
    environment,
    mismatches,
    name,
    needed_packages,
    normalized,
    opted_out,
    run_page,
    session_blocks,
    statistics,
    transcript,
    with_transcripts,
)

#: The pages with blocks to run, one test each.
RUN = [page for page in PAGES if blocks(page.read_text())]


def test_the_pages_and_their_blocks_are_found():
    found = {name(page): blocks(page.read_text()) for page in RUN}
    assert {"README.md", "docs/saving-and-loading.md", "docs/sampling.md", "docs/checkpointing.md"} <= found.keys()
    assert sum(block.kind == "python" for page in found.values() for block in page) >= 20
    assert sum(block.kind == "console" for page in found.values() for block in page) >= 4


def _s3_environment(request: pytest.FixtureRequest, names: list[str]) -> dict[str, str]:
    """fsspec's environment variables for the test's S3 server (a skip where it cannot start), with the buckets made."""
    server = request.getfixturevalue("s3_server")
    import s3fs

    store = s3fs.S3FileSystem(**server.storage_options)
    for bucket in names:
        if not store.exists(bucket):
            store.mkdir(bucket)
    options = server.storage_options
    return {
        "FSSPEC_S3_KEY": options["key"],
        "FSSPEC_S3_SECRET": options["secret"],
        "FSSPEC_S3_ENDPOINT_URL": server.endpoint,
    }


@pytest.mark.parametrize("page", RUN, ids=name)
def test_every_block_runs_as_written(page: Path, tmp_path, missing_optional, request):
    found = blocks(page.read_text())
    left_out = [block for block in found if opted_out(block)]
    for block in left_out:
        reason = block.text.splitlines()[0]
        for prefix in OPT_OUT:
            reason = reason.removeprefix(prefix)
        assert reason.strip(), f"line {block.line} of {name(page)}: say why it is not run"
    assert len(left_out) <= 1, f"{name(page)}: keep the blocks that are not run rare"
    missing = missing_optional(needed_packages(found), anywhere=True)
    if missing:
        pytest.skip(f"the examples of {name(page)} need {', '.join(missing)}, not installed here")
    needed_buckets = buckets(found)
    env = environment(_s3_environment(request, needed_buckets) if needed_buckets else None)
    outcome = run_page(page, tmp_path, env)
    if any(os.environ.get(variable) for variable in UPDATE):
        page.write_text(with_transcripts(page.read_text(), outcome.printed))
        return
    problems = mismatches(page, outcome.printed)
    if problems:
        pytest.fail(
            f"{name(page)} is not what its commands print (JAXSTOW_DOCS_UPDATE=1 pytest tests/test_docs.py "
            f"writes it):\n" + "\n\n".join(problems)
        )
    if outcome.short_of_devices:
        lines = ", ".join(str(block.line) for block in outcome.short_of_devices)
        most = max(devices(block) for block in outcome.short_of_devices)
        pytest.skip(
            f"{name(page)}: every block ran but those at lines {lines}, which need {most} devices "
            f"({outcome.devices} here)"
        )


def test_a_block_that_needs_several_devices_defines_nothing_later_blocks_use():
    found = {name(page): session_blocks(blocks(page.read_text())) for page in RUN}
    assert any(devices(block) > 1 for page in found.values() for block in page)
    assert {page: borrowed_from_device_blocks(page_blocks) for page, page_blocks in found.items()} == {
        page: {} for page in found
    }
    sample = [
        Block("python", "import jax.numpy as jnp\nmesh = jax.make_mesh((4,), ('x',))  # device_count=4\n", 1, (0, 0)),
        Block("python", "import jax\nmodel = jnp.zeros(3)\n", 5, (0, 0)),
        Block("python", "import jax.numpy as jnp\nmodel = jnp.ones(3) + len(mesh.devices)\n", 9, (0, 0)),
    ]
    assert borrowed_from_device_blocks(sample) == {5: {"jnp"}, 9: {"mesh"}}


def test_what_a_page_needs_is_read_from_its_blocks():
    page = (
        "```python\nimport equinox\nurl = 's3://models/a.jxs'\n```\n"
        "```python\n# not run by the docs test: a sketch\nimport torch\n```\n"
        "```console\n$ jaxstow watch s3://runs/run.h5 --once\nrun.h5: finished\n```\n"
    )
    found = blocks(page)
    assert [block.line for block in found] == [2, 6, 10]
    assert [opted_out(block) for block in found] == [False, True, False]
    assert buckets(found) == ["models", "runs"]
    assert needed_packages(found).split("\n")[:2] == ["import arviz", "import equinox"]
    assert "torch" not in needed_packages(found)
    assert devices(Block("python", "mesh = jax.make_mesh((4,), ('x',))  # device_count=4\n", 1, (0, 0))) == 4
    assert with_transcripts(page, {10: "$ jaxstow watch s3://runs/run.h5 --once\nrun.h5: running\n"}).endswith(
        "```console\n$ jaxstow watch s3://runs/run.h5 --once\nrun.h5: running\n```\n"
    )


_PAGE = """# A page

```python
import jax
devices_here = jax.device_count()
```

```python
mesh = jax.make_mesh((8,), ("x",))  # device_count=8, more than the session has
```

```python
# hello.py: a script the reader saves
import sys
print("hello from", sys.argv[1])
```

```console
$ python hello.py page; ls
hello from page
hello.py
```
"""


def test_a_page_runs_in_its_folder_leaving_out_what_needs_more_devices(tmp_path):
    page, folder = tmp_path / "page.md", tmp_path / "run"
    page.write_text(_PAGE)
    folder.mkdir()
    outcome = run_page(page, folder, environment())
    assert outcome.devices == 4
    assert [block.line for block in outcome.short_of_devices] == [9]
    assert outcome.printed == {19: "$ python hello.py page; ls\nhello from page\nhello.py\n"}
    assert mismatches(page, outcome.printed) == []
    assert mismatches(page, {19: "$ python hello.py page; ls\nhello from elsewhere\nhello.py\n"}) != []
    page.write_text(_PAGE.replace("devices_here = jax.device_count()", "devices_here = 1 / 0"))
    with pytest.raises(AssertionError, match=r"(?s)the block at line 4 of page\.md failed.*ZeroDivisionError"):
        run_page(page, folder, environment())


_WATCHED = """$ jaxstow watch run.h5 --once
run.h5: finished, 4 chains
chain  draws  state
0        500  finished
variable  mean     r_hat  ess_bulk
eta[0]     0.2904  1.001      2326
eta[7]    0.03262  1.000      2615
mu          4.399  1.008      1943
"""


def test_a_runs_statistics_are_held_to_their_columns_and_ranges_not_digits():
    assert statistics(_WATCHED)[1][2] == ("mu", {"mean": 4.399, "r_hat": 1.008, "ess_bulk": 1943.0})
    other_machine = (
        _WATCHED.replace("mean     r_hat", "mean      r_hat")
        .replace("eta[0]     0.2904  1.001      2326", "eta[0]      0.3415  1.002      2101")
        .replace("eta[7]    0.03262", "eta[7]    -0.05603")
    )
    assert differences(_WATCHED, other_machine) == []
    assert differences(_WATCHED, _WATCHED.replace("mu          4.399", "mu          9.399")) == [
        "mu mean: 9.399 printed, out of the range around the page's 4.399"
    ]
    assert differences(_WATCHED, _WATCHED.replace("1.008", "1.300")) == [
        "mu r_hat: 1.3 printed, out of the range around the page's 1.008"
    ]
    assert differences(_WATCHED, _WATCHED.replace("2615", "12")) == [
        "eta[7] ess_bulk: 12.0 printed, out of the range around the page's 2615.0"
    ]
    for changed in (
        _WATCHED.replace("mu          4.399  1.008      1943\n", ""),  # a variable missing
        _WATCHED.replace("eta[7]", "eta[6]"),  # another variable
        _WATCHED.replace("r_hat  ess_bulk", "r_hat  ess_tail"),  # another column
        _WATCHED.replace("0.2904", "n/a"),  # not a number
        _WATCHED.replace("0        500", "0        499"),  # outside the table: every digit counts
        _WATCHED.replace("0        500", "0         500"),  # and every space
    ):
        assert differences(_WATCHED, changed), changed


def test_a_transcript_is_read_as_commands_and_outputs():
    text = "$ jaxstow ls runs   # a comment\nstep  time\n 100  2026-11-23 11:43:14\n\n$ jaxstow verify f\nok\n"
    assert transcript(text) == [
        ("jaxstow ls runs   # a comment", "step  time\n 100  2026-11-23 11:43:14"),
        ("jaxstow verify f", "ok"),
    ]
    assert (
        normalized(" 100  2026-11-23 11:43:14  expected xxh3 512168b5e7439e7a") == " 100  <time>  expected xxh3 <xxh3>"
    )


_FENCE = re.compile(r"^```.*?^```$", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)


def _prose(text: str) -> str:
    """A page without its code: fenced blocks and code spans, which hold no links or headings."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _anchor(heading: str) -> str:
    """A heading's anchor where GitHub and MkDocs agree on it, else a string no link can match."""
    text = heading.replace("`", "").lower()
    github = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    mkdocs = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip())
    return github if github == mkdocs else f"<{github} on GitHub, {mkdocs} on MkDocs>"


def anchors(page: Path) -> set[str]:
    return {_anchor(heading) for heading in _HEADING.findall(_FENCE.sub("", page.read_text()))}


def broken_links(page: Path) -> list[str]:
    """Each relative link of a page that leads to no file, or to no heading of a page."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https://, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.is_file():
            broken.append(f"{target}: no file {linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading of {name(linked)} has the anchor #{anchor}")
    return broken


def test_every_relative_link_leads_to_a_file_and_heading():
    assert {page: broken_links(page) for page in PAGES} == {page: [] for page in PAGES}
    links = [target for page in PAGES for target in _LINK.findall(_prose(page.read_text()))]
    assert any("#" in target and not target.startswith("http") for target in links)
    assert len([target for target in links if target.endswith(".md")]) >= 12


def test_a_broken_link_or_anchor_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr("test_docs.ROOT", tmp_path)
    monkeypatch.setattr("docs_blocks.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## The `io` face, in short\n\ntext\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n\n[a](docs/a.md) [a](docs/a.md#the-io-face-in-short) [top](#top) [web](https://example.com/x.md)\n"
        "`[not a link](nowhere.md)`\n\n```python\n# [nor this](nowhere.md)\n```\n"
        "[b](docs/b.md) [a](docs/a.md#the-io-face) [up](#bottom)\n"
    )
    assert broken_links(page) == [
        "docs/b.md: no file docs/b.md",
        "docs/a.md#the-io-face: no heading of docs/a.md has the anchor #the-io-face",
        "#bottom: no heading of README.md has the anchor #bottom",
    ]
