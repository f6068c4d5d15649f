"""The code blocks of the documentation's pages (README.md and docs/*.md), read, run and compared with what they show.

- A page's ```python blocks run in one Python session that lives through the whole page, so names and files carry
  over from block to block as in a reader's session; every page has a session and a fresh folder of its own. The
  session has 4 CPU devices (``XLA_FLAGS``, as the pages say where a block needs them) and matplotlib draws to files.
  The session's process and those of the ``jaxstow`` commands are forked from servers that have imported jax and
  jaxstow (``forked.py``); the other commands (``python script.py``, ...) start as a reader's shell starts them.
- A ```python block whose first line is ``# NAME.py: ...`` is a script the reader saves: it is written to NAME.py
  in the folder, for a console block to run.
- A ```console block's ``$ command`` lines run in a shell in the same folder, at their place in the page, and what
  each prints must be what the page shows below it, times and checksums aside. A table of a sampling run's
  statistics (``jaxstow watch``: ``variable  mean  r_hat  ess_bulk``) comes from a seeded MCMC run, whose digits
  differ with the CPU's instruction set and the libraries' versions: its header, its variables and their order must
  be the page's, and each value a number in the range :data:`STATISTICS` gives around the page's.
- A block is left out only with a first line ``# not run by the docs test: REASON`` (or the older ``# not run by the
  README test: REASON``).
- Pages are read on machines with one device: a block that needs several (``device_count=4``) defines nothing that a
  later block uses, so that a session with fewer devices runs the others. A page whose ``s3://`` URLs need an S3
  server finds it through fsspec's environment variables (``FSSPEC_S3_ENDPOINT_URL``, ...), with the buckets it names
  made.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import forked
from xla_flags import xla_flags

ROOT = Path(__file__).parents[2]
#: Every page of the documentation, the README first.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPT_OUT = ("# not run by the docs test:", "# not run by the README test:")
#: Either variable, set to anything, makes the test write what the commands print into the pages instead.
UPDATE = ("JAXSTOW_DOCS_UPDATE", "JAXSTOW_README_UPDATE")
#: What a page's commands need beyond what its blocks import: ArviZ for ``jaxstow watch``.
COMMAND_NEEDS = {"jaxstow watch": "arviz"}

_BLOCK = re.compile(r"^```(python|console)\n(.*?)^```$", re.S | re.M)
_SCRIPT = re.compile(r"# ([\w-]+\.py): ")
#: What differs from run to run in a transcript: times, and checksums (of data that depends on jax's random bits).
_VOLATILE = [(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), "<time>"), (re.compile(r"\b[0-9a-f]{16}\b"), "<xxh3>")]

#: What each column of a run's statistics may print, given what the page shows: posterior means within 1 of the
#: page's (many Monte Carlo errors of its 2000 draws), R-hat of chains that mixed, and a bulk ESS within 4x.
STATISTICS: dict[str, Callable[[float, float], bool]] = {
    "mean": lambda shown, printed: abs(printed - shown) <= 1.0,
    "r_hat": lambda shown, printed: 0.99 <= printed <= 1.05,
    "ess_bulk": lambda shown, printed: shown / 4 <= printed <= shown * 4,
}
_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")
_DEVICES = re.compile(r"device_count=(\d+)")
_BUCKET = re.compile(r"\bs3://([a-z0-9][a-z0-9.-]*)")

#: The session: runs each block it is sent (one JSON line: the code, the page and the block's line), then prints a
#: NUL, "ok" or the traceback as JSON, and a newline.
_SESSION = """
import json, sys, traceback
names = {"__name__": "__main__"}
for request in sys.stdin:
    block = json.loads(request)
    try:
        exec(compile(block["code"], f"{block['page']} (block at line {block['line']})", "exec"), names)
        outcome = "ok"
    except BaseException:
        outcome = traceback.format_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    print("\\0" + json.dumps(outcome), flush=True)
"""


@dataclass
class Block:
    kind: str
    text: str
    line: int
    span: tuple[int, int]  # of the text in the page


def name(page: Path) -> str:
    """A page as the repository names it: ``README.md``, ``docs/sampling.md`` (a page elsewhere by its file name)."""
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


def blocks(text: str) -> list[Block]:
    return [
        Block(found[1], found[2], text.count("\n", 0, found.start()) + 2, found.span(2))
        for found in _BLOCK.finditer(text)
    ]


def opted_out(block: Block) -> bool:
    return block.text.startswith(OPT_OUT)


def script(block: Block) -> str | None:
    """The file name a script block is saved as; ``None`` for a block the session runs."""
    found = _SCRIPT.match(block.text) if block.kind == "python" else None
    return None if found is None else found[1]


def session_blocks(found: list[Block]) -> list[Block]:
    return [block for block in found if block.kind == "python" and not opted_out(block) and script(block) is None]


def transcript(text: str) -> list[tuple[str, str]]:
    """A console block as (command, what it printed) pairs."""
    pairs: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        else:
            assert pairs, f"a console block starts with a `$ command` line, not {line!r}"
            pairs[-1][1].append(line)
    return [(command, "\n".join(output).strip("\n")) for command, output in pairs]


def normalized(text: str) -> str:
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


def statistics(text: str) -> tuple[str, list[tuple[str, dict[str, float]]]]:
    """The text with each row of a table of run statistics cut to its variable's name (and the table's header to its
    words), and the rows' values."""
    lines, rows, columns = [], [], None
    for line in text.splitlines():
        words = line.split()
        if len(words) > 1 and words[0] == "variable" and set(words[1:]) <= STATISTICS.keys():
            columns = words[1:]
            line = " ".join(words)  # its columns are as wide as their values
        elif columns and len(words) == len(columns) + 1 and all(_NUMBER.fullmatch(word) for word in words[1:]):
            rows.append((words[0], dict(zip(columns, map(float, words[1:]), strict=True))))
            line = f"{words[0]}  <statistics>"
        else:
            columns = None
        lines.append(line)
    return "\n".join(lines), rows


def differences(shown: str, printed: str) -> list[str]:
    """How what a console block's commands printed differs from what the page shows; empty if it does not."""
    shown_text, shown_rows = statistics(normalized(shown))
    printed_text, printed_rows = statistics(normalized(printed))
    if shown_text != printed_text:
        return list(difflib.unified_diff(shown.splitlines(), printed.splitlines(), "page", "printed", lineterm=""))
    return [
        f"{variable} {column}: {value} printed, out of the range around the page's {expected[column]}"
        for (variable, expected), (_, values) in zip(shown_rows, printed_rows, strict=True)
        for column, value in values.items()
        if not STATISTICS[column](expected[column], value)
    ]


def _bound(code: str) -> set[str]:
    """The names a block binds: assigned, imported, defined."""
    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            found.add(node.name)
    return found


def _used(code: str) -> set[str]:
    return {
        node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def devices(block: Block) -> int:
    """How many devices a block needs: the largest ``device_count=N`` it mentions, else 1."""
    return max((int(count) for count in _DEVICES.findall(block.text)), default=1)


def borrowed_from_device_blocks(found: list[Block]) -> dict[int, set[str]]:
    """For each session block, the names it uses that only an earlier block needing several devices defines."""
    on_one_device = set(dir(builtins))
    only_there: set[str] = set()
    borrowed = {}
    for block in found:
        bound = _bound(block.text)
        names = (_used(block.text) - bound - on_one_device) & only_there
        if names:
            borrowed[block.line] = names
        if devices(block) > 1:
            only_there |= bound - on_one_device
        else:
            on_one_device |= bound
            only_there -= bound
    return borrowed


def buckets(found: list[Block]) -> list[str]:
    """The S3 buckets a page's code and commands name (``s3://BUCKET/...``); a page that names any needs a server."""
    code = "\n".join(block.text for block in found if not opted_out(block))
    return sorted(set(_BUCKET.findall(code)))


def needed_packages(found: list[Block]) -> str:
    """The code whose imports name what a page needs: its python blocks, and the imports its commands need."""
    commands = " ".join(command for block in found if block.kind == "console" for command, _ in transcript(block.text))
    also = [f"import {package}" for words, package in COMMAND_NEEDS.items() if words in commands]
    return "\n".join([*also, *(block.text for block in found if block.kind == "python" and not opted_out(block))])


def _commands() -> str:
    """A folder holding ``jaxstow``: a command that runs ``python -m jaxstow`` forked from the fork server its
    environment names (``fork_client.py``), or started afresh where it names none; removed when this process ends."""
    folder = Path(tempfile.gettempdir()) / f"jaxstow-docs-commands-{os.getpid()}"
    if not folder.exists():
        folder.mkdir()
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    script = folder / "jaxstow"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -E "{Path(__file__).parent / "fork_client.py"}" "$@"\n')
    script.chmod(0o755)
    return str(folder)


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a page's commands: this one's, less ``XLA_FLAGS``, with the project and this Python first."""
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    paths = [os.path.abspath(path) for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    env["PATH"] = os.pathsep.join([_commands(), os.path.dirname(sys.executable), env.get("PATH", "")])
    env["MPLBACKEND"] = "Agg"
    env["COLUMNS"] = "200"
    return {**env, **(extra or {})}


class Session:
    """One Python process that runs a page's python blocks one after another."""

    def __init__(self, page: str, folder: Path, env: dict[str, str]) -> None:
        self.page = page
        self.process = forked.Popen(
            [sys.executable, "-c", _SESSION],
            cwd=folder,
            env={**env, "XLA_FLAGS": xla_flags(4)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(self, code: str, line: int) -> str:
        """Run the code of the block at ``line``; what it printed."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"code": code, "page": self.page, "line": line}) + "\n")
        self.process.stdin.flush()
        printed = []
        for output in self.process.stdout:
            if output.startswith("\0"):
                outcome = json.loads(output[1:])
                assert outcome == "ok", f"the block at line {line} of {self.page} failed:\n{''.join(printed)}{outcome}"
                return "".join(printed)
            printed.append(output)
        raise AssertionError(f"the session ended in the block at line {line} of {self.page}:\n{''.join(printed)}")

    def device_count(self) -> int:
        """How many devices the session's jax has (binding no name in it)."""
        return int(self.run("print(__import__('jax').device_count())", 0).split()[-1])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def run_console(block: Block, folder: Path, env: dict[str, str]) -> str:
    """Run a console block's commands; the block as they print it."""
    env = {**env, "JAXSTOW_TESTS_FORK_SERVER": forked.server(env)}  # where `jaxstow` forks its process from
    parts = []
    for command, _ in transcript(block.text):
        done = subprocess.run(  # a terminal shows both streams
            ["bash", "-c", command],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert "Traceback" not in done.stdout, f"{command}:\n{done.stdout}"
        parts.append(f"$ {command}\n{done.stdout.rstrip()}".rstrip())
    return "\n\n".join(parts) + "\n"


@dataclass
class Outcome:
    """What running a page gave: each console block's transcript by its line, and the blocks left out for want of
    devices."""

    printed: dict[int, str]
    short_of_devices: list[Block]
    devices: int


def run_page(page: Path, folder: Path, env: dict[str, str]) -> Outcome:
    """Run every block of a page in order, in ``folder``: the python blocks in one session, the scripts written, the
    console blocks' commands in a shell. A block that needs more devices than the session has is left out."""
    found = blocks(page.read_text())
    session = Session(name(page), folder, env)
    outcome = Outcome({}, [], 1)
    try:
        if any(devices(block) > 1 for block in session_blocks(found)):
            outcome.devices = session.device_count()
        for block in found:
            if opted_out(block):
                continue
            if script(block) is not None:
                (folder / str(script(block))).write_text(block.text)
            elif block.kind == "python" and devices(block) > outcome.devices:
                outcome.short_of_devices.append(block)
            elif block.kind == "python":
                session.run(block.text, block.line)
            else:
                outcome.printed[block.line] = run_console(block, folder, env)
    finally:
        session.close()
    return outcome


def with_transcripts(text: str, printed: dict[int, str]) -> str:
    """The page's text with each console block replaced by what its commands printed."""
    for block in sorted((b for b in blocks(text) if b.line in printed), key=lambda b: -b.span[0]):
        text = text[: block.span[0]] + printed[block.line] + text[block.span[1] :]
    return text


def mismatches(page: Path, printed: dict[int, str]) -> list[str]:
    """For each console block whose commands printed other than the page shows, what differs."""
    found = []
    for block in blocks(page.read_text()):
        problems = differences(block.text, printed[block.line]) if block.line in printed else []
        if problems:
            found.append(f"the console block at line {block.line} of {name(page)}:\n" + "\n".join(problems))
    return found
