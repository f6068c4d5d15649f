"""Every block of the README runs as written, in order, in one fresh folder; its console transcripts are what the
commands print.

- A ```python block runs in one Python session that lives through the whole README, so names and files carry over
  from block to block as in a reader's session. The session has 4 CPU devices (``XLA_FLAGS``, as the README says
  where a block needs them) and matplotlib draws to files.
- A ```python block whose first line is ``# NAME.py: ...`` is a script the reader saves: it is written to NAME.py
  in the folder, for a console block to run.
- A ```console block's ``$ command`` lines run in a shell in the same folder, at their place in the README, and what
  each prints must be what the README shows below it, times and checksums aside. ``JAXSTOW_README_UPDATE=1`` writes
  what they print into the README instead.
- A block is left out only with a first line ``# not run by the README test: REASON``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
OPT_OUT = "# not run by the README test:"
_BLOCK = re.compile(r"^```(python|console)\n(.*?)^```$", re.S | re.M)
_SCRIPT = re.compile(r"# ([\w-]+\.py): ")
#: What differs from run to run in a transcript: times, and checksums (of data that depends on jax's random bits).
_VOLATILE = [(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), "<time>"), (re.compile(r"\b[0-9a-f]{16}\b"), "<xxh3>")]

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


def test_every_block_runs_as_written(tmp_path):
    readme = README.read_text()
    found = blocks(readme)
    assert sum(block.kind == "python" for block in found) >= 8 and any(block.kind == "console" for block in found)
    opted_out = [block for block in found if block.text.startswith(OPT_OUT)]
    for block in opted_out:
        assert block.text.splitlines()[0].removeprefix(OPT_OUT).strip(), f"line {block.line}: say why it is not run"
    assert len(opted_out) <= 1, "keep the blocks that are not run rare"
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
        if block.line in printed and normalized(printed[block.line]) != normalized(block.text):
            diff = "\n".join(
                difflib.unified_diff(block.text.splitlines(), printed[block.line].splitlines(), "README", "printed")
            )
            pytest.fail(
                f"the console block at line {block.line} of README.md is not what the commands print "
                f"(JAXSTOW_README_UPDATE=1 pytest tests/test_readme.py writes it):\n{diff}"
            )


def test_a_transcript_is_read_as_commands_and_outputs():
    text = "$ jaxstow ls runs   # a comment\nstep  time\n 100  2026-11-23 11:43:14\n\n$ jaxstow verify f\nok\n"
    assert transcript(text) == [
        ("jaxstow ls runs   # a comment", "step  time\n 100  2026-11-23 11:43:14"),
        ("jaxstow verify f", "ok"),
    ]
    assert (
        normalized(" 100  2026-11-23 11:43:14  expected xxh3 512168b5e7439e7a") == " 100  <time>  expected xxh3 <xxh3>"
    )
