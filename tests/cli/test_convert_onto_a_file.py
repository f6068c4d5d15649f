"""``jaxstow convert`` writes a new file: a DST that exists (a step's item file, a day's training) is refused and left
as it was, unless ``--overwrite`` says to replace it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from forked_cli import jaxstow_command

import jaxstow
from jaxstow import CheckpointManager


def test_convert_onto_a_checkpoint_steps_file_is_refused_and_the_step_stays_intact(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(5, {"w": np.full(3, 5.0)})
        manager.save(6, {"w": np.full(3, 6.0)})
    (older,) = [path for path in (tmp_path / "run" / "5").iterdir() if path.name != "checkpoint.json"]
    newer = tmp_path / "run" / "6" / older.name
    finished = jaxstow_command("convert", older, newer)
    # was: step 6's file replaced by a plain copy of step 5's, step 6 then reported DAMAGED
    assert finished.returncode == 2 and "Traceback" not in finished.stderr
    assert finished.stderr.strip() == (
        f"jaxstow convert: {newer}: exists already (a file): convert writes a new file; give another DST, or "
        "--overwrite to replace it"
    )
    np.testing.assert_array_equal(CheckpointManager(tmp_path / "run").restore(6)["w"], np.full(3, 6.0))
    assert jaxstow_command("verify", str(tmp_path / "run")).returncode == 0


def test_convert_with_overwrite_replaces_the_file_there(tmp_path: Path) -> None:
    np.savez(tmp_path / "new.npz", w=np.ones(2))
    jaxstow.save(tmp_path / "model.jxs", {"w": np.zeros(2)})
    refused = jaxstow_command("convert", tmp_path / "new.npz", tmp_path / "model.jxs")
    assert refused.returncode == 2 and "exists already (a file)" in refused.stderr
    np.testing.assert_array_equal(jaxstow.load(tmp_path / "model.jxs", as_numpy=True)["w"], np.zeros(2))
    assert jaxstow_command("convert", tmp_path / "new.npz", tmp_path / "model.jxs", "--overwrite").returncode == 0
    np.testing.assert_array_equal(jaxstow.load(tmp_path / "model.jxs", as_numpy=True)["w"], np.ones(2))
    folder = tmp_path / "folder"
    folder.mkdir()
    into_folder = jaxstow_command("convert", tmp_path / "new.npz", folder)
    assert into_folder.returncode == 2 and "exists already (a folder)" in into_folder.stderr


def test_convert_onto_src_itself_into_a_format_that_holds_less_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    src = tmp_path / "run.jxs"
    jaxstow.save(src, {"w": np.ones(3, np.float32), "lr": 0.001, "layers": (np.zeros(2, np.float32),)})
    before = src.read_bytes()
    # was: the only copy became a plain safetensors file, its values, structure and metadata gone
    finished = jaxstow_command("convert", src, src, "--to", "safetensors", "--overwrite")
    assert finished.returncode == 2 and "Traceback" not in finished.stderr
    assert finished.stderr.strip() == (
        f"jaxstow convert: {src}: is SRC itself, jaxstow: the safetensors file written there would replace the only "
        f"copy of what it holds with one that holds less; give another DST, such as {tmp_path / 'run.safetensors'}, "
        "and move it over SRC once it is checked"
    )
    assert src.read_bytes() == before
    (tmp_path / "link.safetensors").symlink_to(src)
    assert "is SRC itself" in jaxstow_command("convert", src, tmp_path / "link.safetensors", "--overwrite").stderr
    assert src.read_bytes() == before
    assert jaxstow_command("convert", src, src, "--overwrite").returncode == 0  # to jaxstow: it holds it all
    assert jaxstow.load(src, as_numpy=True)["lr"] == 0.001


def test_convert_into_the_folder_it_reads_is_refused_and_the_folder_stays_whole(tmp_path: Path) -> None:
    jaxstow.save(tmp_path / "model.jxs", {"a": {"weight": np.ones((64, 3), np.float32)}, "b": np.zeros(64, np.float32)})
    folder = tmp_path / "hf"
    jaxstow.huggingface.export_safetensors(tmp_path / "model.jxs", folder, max_shard_size=800)  # 2 shards, an index
    files = {path.name: path.read_bytes() for path in folder.iterdir()}
    for dst, extra in ((folder / "model.jxs", ()), (folder / next(iter(files)), ("--overwrite",))):
        # was: model.jxs beside the shards, or a shard replaced by the whole model: the folder no longer loaded
        finished = jaxstow_command("convert", folder, dst, *extra)
        assert finished.returncode == 2 and "Traceback" not in finished.stderr
        assert f"{dst}: is inside SRC, the folder converted" in finished.stderr, finished.stderr
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == files
    assert jaxstow_command("convert", folder, tmp_path / "whole.jxs").returncode == 0
