"""Every block of the README runs as written, in order, in one fresh folder; its console transcripts are what the
commands print.

- A ```python block runs in one Python session that lives through the whole README, so names and files carry over
  from block to block as in a reader's session. The session has 4 CPU devices (``XLA_FLAGS``, as the README says
  where a block needs them) and matplotlib draws to files.
- A ```python block whose first line is ``# NAME.py: ...`` is a script the reader saves: it is written to NAME.py
  in the folder, for a console block to run.
- A ```console block's ``$ command`` lines run in a shell in the same folder, at their place in the README, and what
  each prints must be what the README shows below it, times and checksums aside. A table of a sampling run's
  statistics (``jaxstow watch``: ``variable  mean  r_hat  ess_bulk``) comes from a seeded MCMC run, whose digits
  differ with the CPU's instruction set and the libraries' versions: its header, its variables and their order must
  be the README's, and each value a number in the range :data:`STATISTICS` gives around the README's.
  ``JAXSTOW_README_UPDATE=1`` writes what they print into the README instead.
- A block is left out only with a first line ``# not run by the README test: REASON``.
- The README is read on machines with one device: a block that needs several (``device_count=4``) defines nothing
  that a later block uses, and the test is skipped, naming the package, where one the README imports is missing.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"
OPT_OUT = "# not run by the README test:"
_BLOCK = re.compile(r"^```(python|console)\n(.*?)^```$", re.S | re.M)
_SCRIPT = re.compile(r"# ([\w-]+\.py): ")
#: What differs from run to run in a transcript: times, and checksums (of data that depends on jax's random bits).
_VOLATILE = [(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), "<time>"), (re.compile(r"\b[0-9a-f]{16}\b"), "<xxh3>")]

#: What each column of a run's statistics may print, given what the README shows: posterior means within 1 of the
#: README's (many Monte Carlo errors of its 2000 draws), R-hat of chains that mixed, and a bulk ESS within 4x.
STATISTICS: dict[str, Callable[[float, float], bool]] = {
    "mean": lambda shown, printed: abs(printed - shown) <= 1.0,
    "r_hat": lambda shown, printed: 0.99 <= printed <= 1.05,
    "ess_bulk": lambda shown, printed: shown / 4 <= printed <= shown * 4,
}
_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")
_DEVICES = re.compile(r"device_count=(\d+)")
#: What the README's commands need beyond what its blocks import: ArviZ for ``jaxstow watch``.
ALSO_NEEDED = ("arviz",)

#: The session: runs each block it is sent (one JSON line: the code and its line in the README), then prints a NUL,
#: "ok" or the traceback as JSON, and a newline.
_SESSION = """
import json, sys, traceback
names = {"__name__": "__main__"}
for request in sys.stdin:
    block = json.loads(request)
    try:
        exec(compile(block["code"], f"README.md (block at line {block['line']})", "exec"), names)
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
    span: tuple[int, int]  # of the text in the README


def blocks(readme: str) -> list[Block]:
    return [
        Block(found[1], found[2], readme.count("\n", 0, found.start()) + 2, found.span(2))
        for found in _BLOCK.finditer(readme)
    ]


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
    """How what a console block's commands printed differs from what the README shows; empty if it does not."""
    shown_text, shown_rows = statistics(normalized(shown))
    printed_text, printed_rows = statistics(normalized(printed))
    if shown_text != printed_text:
        return list(difflib.unified_diff(shown.splitlines(), printed.splitlines(), "README", "printed", lineterm=""))
    return [
        f"{name} {column}: {value} printed, out of the range around the README's {expected[column]}"
        for (name, expected), (_, values) in zip(shown_rows, printed_rows, strict=True)
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


def _devices(block: Block) -> int:
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
        if _devices(block) > 1:
            only_there |= bound - on_one_device
        else:
            on_one_device |= bound
            only_there -= bound
    return borrowed


def _session_blocks(found: list[Block]) -> list[Block]:
    return [
        block
        for block in found
        if block.kind == "python" and not block.text.startswith(OPT_OUT) and _SCRIPT.match(block.text) is None
    ]


def _environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    paths = [os.path.abspath(path) for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(README.parent)])
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # python, jaxstow
    env["MPLBACKEND"] = "Agg"
    env["COLUMNS"] = "200"
    return env


class Session:
    """One Python process that runs the README's python blocks one after another."""

    def __init__(self, folder: Path) -> None:
        env = {**_environment(), "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SESSION],
            cwd=folder,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(self, block: Block) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"code": block.text, "line": block.line}) + "\n")
        self.process.stdin.flush()
        printed = []
        for line in self.process.stdout:
            if line.startswith("\0"):
                outcome = json.loads(line[1:])
                assert outcome == "ok", (
                    f"the block at line {block.line} of README.md failed:\n{''.join(printed)}{outcome}"
                )
                return
            printed.append(line)
        raise AssertionError(f"the session ended in the block at line {block.line}:\n{''.join(printed)}")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def run_console(block: Block, folder: Path) -> str:
    """Run a console block's commands; the block as they print it."""
    parts = []
    for command, _ in transcript(block.text):
        done = subprocess.run(  # a terminal shows both streams
            ["bash", "-c", command],
            cwd=folder,
            env=_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert "Traceback" not in done.stdout, f"{command}:\n{done.stdout}"
        parts.append(f"$ {command}\n{done.stdout.rstrip()}".rstrip())
    return "\n\n".join(parts) + "\n"


def test_every_block_runs_as_written(tmp_path, missing_optional):
    readme = README.read_text()
    found = blocks(readme)
    assert sum(block.kind == "python" for block in found) >= 8 and any(block.kind == "console" for block in found)
    opted_out = [block for block in found if block.text.startswith(OPT_OUT)]
    for block in opted_out:
        assert block.text.splitlines()[0].removeprefix(OPT_OUT).strip(), f"line {block.line}: say why it is not run"
    assert len(opted_out) <= 1, "keep the blocks that are not run rare"
    code = "\n".join([*(f"import {name}" for name in ALSO_NEEDED), *(b.text for b in found if b.kind == "python")])
    missing = missing_optional(code, anywhere=True)
    if missing:
        pytest.skip(f"the README's examples need {', '.join(missing)}, not installed here")
    session = Session(tmp_path)
    printed: dict[int, str] = {}
    try:
        for block in found:
            if block in opted_out:
                continue
            script = _SCRIPT.match(block.text)
            if block.kind == "python" and script is not None:
                (tmp_path / script[1]).write_text(block.text)
            elif block.kind == "python":
                session.run(block)
            else:
                printed[block.line] = run_console(block, tmp_path)
    finally:
        session.close()
    if os.environ.get("JAXSTOW_README_UPDATE"):
        for block in sorted((b for b in found if b.line in printed), key=lambda b: -b.span[0]):
            readme = readme[: block.span[0]] + printed[block.line] + readme[block.span[1] :]
        README.write_text(readme)
        return
    for block in found:
        problems = differences(block.text, printed[block.line]) if block.line in printed else []
        if problems:
            pytest.fail(
                f"the console block at line {block.line} of README.md is not what the commands print "
                f"(JAXSTOW_README_UPDATE=1 pytest tests/docs/test_readme.py writes it):\n" + "\n".join(problems)
            )


def test_a_block_that_needs_several_devices_defines_nothing_later_blocks_use():
    found = _session_blocks(blocks(README.read_text()))
    assert any(_devices(block) > 1 for block in found)
    assert borrowed_from_device_blocks(found) == {}
    sample = [
        Block("python", "import jax.numpy as jnp\nmesh = jax.make_mesh((4,), ('x',))  # device_count=4\n", 1, (0, 0)),
        Block("python", "import jax\nmodel = jnp.zeros(3)\n", 5, (0, 0)),
        Block("python", "import jax.numpy as jnp\nmodel = jnp.ones(3) + len(mesh.devices)\n", 9, (0, 0)),
    ]
    assert borrowed_from_device_blocks(sample) == {5: {"jnp"}, 9: {"mesh"}}


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
        "mu mean: 9.399 printed, out of the range around the README's 4.399"
    ]
    assert differences(_WATCHED, _WATCHED.replace("1.008", "1.300")) == [
        "mu r_hat: 1.3 printed, out of the range around the README's 1.008"
    ]
    assert differences(_WATCHED, _WATCHED.replace("2615", "12")) == [
        "eta[7] ess_bulk: 12.0 printed, out of the range around the README's 2615.0"
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
