"""The ``jaxstow`` command on a full disk (its files, and its output redirected there), a read-only folder and a name
too long: one line naming the file asked for and the cause in words, exit status 2, no traceback, the file there before left whole. Each command in a process of its own
(``tests/support/forked_cli.py``), on a 1 MiB tmpfs mounted for the test (``tests/support/tmpfs.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forked
import numpy as np
import pytest
from forked_cli import jaxstow_command
from tmpfs import leftovers, make_read_only, small_tmpfs

import jaxstow


@pytest.fixture
def disk(tmp_path: Path):
    with small_tmpfs(tmp_path / "small") as folder:
        yield folder


@pytest.fixture
def big(tmp_path: Path) -> Path:
    """An npz of 2.4 MB, more than the disk holds."""
    path = tmp_path / "big.npz"
    np.savez(path, w=np.ones(300_000))
    return path


def _jaxstow(*args: object) -> tuple[int, list[str]]:
    """Run the command; its exit status and the lines of its standard error."""
    result = jaxstow_command(*args)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stderr.strip().splitlines()


def test_convert_onto_a_full_disk_names_the_file_and_keeps_the_one_there(disk, big):
    target = disk / "model.jxs"
    jaxstow.save(target, {"w": np.arange(4.0)})
    status, lines = _jaxstow("convert", big, target, "--overwrite")
    assert status == 2 and lines == [
        f"jaxstow convert: {target}: cannot write it: no space left on the device holding {disk}; free some space "
        "there, or write elsewhere"
    ]
    np.testing.assert_array_equal(jaxstow.load(target, as_numpy=True)["w"], np.arange(4.0))
    assert os.listdir(disk) == ["model.jxs"]


def test_convert_into_a_read_only_folder_names_the_target_not_the_temporary_file(disk, tmp_path):
    source = tmp_path / "small.npz"
    np.savez(source, w=np.ones(3))
    make_read_only(disk)
    status, lines = _jaxstow("convert", source, disk / "model.safetensors")
    assert status == 2 and lines == [
        f"jaxstow convert: {disk / 'model.safetensors'}: cannot write it: the folder {disk} is read-only; write to a "
        "folder of a file system mounted read-write"
    ]


def test_export_onto_a_full_disk_names_the_shard(disk, big):
    status, lines = _jaxstow("export", big, disk / "hf")
    shard = disk / "hf" / "model-00001-of-00001.safetensors"
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith(f"jaxstow export: {shard}: cannot write it: no space left on the device holding {disk}")
    assert leftovers(disk) == [] and os.listdir(disk) == []


def test_convert_to_a_name_too_long_names_it(tmp_path):
    source = tmp_path / "small.npz"
    np.savez(source, w=np.ones(3))
    target = tmp_path / ("x" * 300 + ".jxs")
    status, lines = _jaxstow("convert", source, target)
    assert status == 2 and lines == [
        f"jaxstow convert: {target}: cannot write it: file name too long (304 bytes; this file system takes at most "
        "255); use a shorter name"
    ]
    assert os.listdir(tmp_path) == ["small.npz"]


@pytest.mark.parametrize("command", [["inspect", "--json"], ["verify"]])
def test_output_redirected_to_a_full_disk_names_the_file_it_goes_to(disk, tmp_path, command):
    """Was: ``jaxstow inspect: [Errno 28] No space left on device``, naming no file."""
    source = tmp_path / "model.jxs"
    jaxstow.save(source, {f"layer{i}": np.ones(3) for i in range(500)})  # an output of more than a page
    free = os.statvfs(disk)
    (disk / "filler").write_bytes(bytes(free.f_bavail * free.f_frsize))
    output = disk / "out.txt"
    with open(output, "wb") as redirected:
        result = forked.run(
            [sys.executable, "-m", "jaxstow", *command, str(source)],
            stdout=redirected,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"jaxstow {command[0]}: {output}: cannot write the command's output there: no space left on the device "
        f"holding {disk}; free some space there, or write elsewhere"
    ]


def test_convert_an_orbax_run_into_a_read_only_or_full_folder_names_the_target_not_the_temporary_one(disk, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    with ocp.CheckpointManager(tmp_path / "orbax_run") as manager:
        for step in (1, 2, 3):
            manager.save(step, args=ocp.args.StandardSave({"w": np.full(100_000, step, np.float32)}))
    status, lines = _jaxstow("convert", tmp_path / "orbax_run", disk / "run")
    assert status == 2 and len(lines) == 1, lines
    assert f"{disk / 'run'}/3/w.safetensors: cannot write it: no space left on the device" in lines[0]
    assert "jaxstow-tmp" not in lines[0] and os.listdir(disk) == []
    make_read_only(disk)
    status, lines = _jaxstow("convert", tmp_path / "orbax_run", disk / "run")
    assert status == 2 and lines == [
        f"jaxstow convert: {disk / 'run'}: cannot make the folder: the folder {disk} is read-only; write to a folder "
        "of a file system mounted read-write"
    ]
