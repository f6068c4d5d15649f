"""``jaxstow convert`` keeps the user's metadata where the new file can hold it (a jaxstow file any, a safetensors file
strings), and says which it leaves behind; it dropped it silently, in place too."""

from __future__ import annotations

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
    assert main(["convert", str(path), str(path)]) == 0
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
