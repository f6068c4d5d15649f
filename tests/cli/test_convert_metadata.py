"""``jaxstow convert`` keeps the user's metadata where the new file can hold it (a jaxstow file any, a safetensors file
strings), and says which it leaves behind; it dropped it silently, in place too."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

import jaxstow
from jaxstow.cli import main


def _metadata(path: Path) -> dict | None:
    with safe_open(str(path), "np") as file:
        return file.metadata()


def test_a_safetensors_files_metadata_stays_in_place_and_goes_into_a_jaxstow_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(path), metadata={"format": "pt", "license": "mit"})
    assert main(["convert", str(path), str(path), "--overwrite"]) == 0
    assert _metadata(path) == {"format": "pt", "license": "mit"}
    assert main(["convert", str(path), str(tmp_path / "model.jxs")]) == 0
    assert jaxstow.load_metadata(tmp_path / "model.jxs") == {"format": "pt", "license": "mit"}


def test_a_jaxstow_files_metadata_goes_along_or_is_named_where_it_cannot(tmp_path: Path, capsys) -> None:
    path = tmp_path / "model.jxs"
    jaxstow.save(path, {"w": np.ones(2, np.float32)}, metadata={"epoch": 3, "run": "a"})
    assert main(["convert", str(path), str(tmp_path / "copy.jxs")]) == 0
    assert jaxstow.load_metadata(tmp_path / "copy.jxs") == {"epoch": 3, "run": "a"}
    assert main(["convert", str(path), str(tmp_path / "plain.safetensors")]) == 0  # 3 is no string
    assert "note: the metadata ('epoch', 'run') has no place in a plain safetensors file" in capsys.readouterr().err


def test_a_hugging_face_folders_metadata_is_its_indexs_as_saved_never_a_shards_format(tmp_path: Path) -> None:
    path = tmp_path / "model.jxs"
    jaxstow.save(path, {"w": np.ones(2, np.float32)}, metadata={"epoch": 3, "run": "a"})
    jaxstow.export_safetensors(path, tmp_path / "hf")  # the index's metadata: total_size, jaxstow_metadata
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back.jxs")]) == 0
    assert jaxstow.load_metadata(tmp_path / "back.jxs") == {"epoch": 3, "run": "a"}  # was {"format": "pt"}

    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(5, {"params": {"w": np.ones(2)}, "opt": {"n": np.zeros(1)}}, metadata={"lr": 0.1})
    jaxstow.export_safetensors(tmp_path / "run" / "5", tmp_path / "hf_step")
    assert main(["convert", str(tmp_path / "hf_step"), str(tmp_path / "step.jxs")]) == 0
    assert jaxstow.load_metadata(tmp_path / "step.jxs") == {"step_metadata": {"lr": 0.1}}

    hub = tmp_path / "hub"  # as the hub holds one: the index's metadata the total size alone
    hub.mkdir()
    save_file({"w": np.ones(2, np.float32)}, str(hub / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    weight_map = {"w": "model-00001-of-00001.safetensors"}
    (hub / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 8}, "weight_map": weight_map})
    )
    assert main(["convert", str(hub), str(tmp_path / "hub.jxs")]) == 0
    assert jaxstow.load_metadata(tmp_path / "hub.jxs") is None
