"""``jaxstow convert FOLDER model.jxs`` of a Hugging Face folder of safetensors files: every shard's tensors in one
file (it was refused as "not an orbax checkpoint that orbax can restore")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import jaxstow
from jaxstow.cli import main

TREE = {"embed": np.arange(12, dtype=np.float32).reshape(3, 4), "head": {"bias": np.array([-1.5, 2.0])}}


@pytest.mark.parametrize("target", ["model.jxs", "weights.safetensors", "weights.npz"])
def test_a_sharded_hugging_face_folder_converts_into_one_file(tmp_path: Path, capsys, target: str) -> None:
    jaxstow.save(tmp_path / "source.jxs", TREE)
    jaxstow.export_safetensors(tmp_path / "source.jxs", tmp_path / "folder", max_shard_size=40)
    assert len(list((tmp_path / "folder").glob("*.safetensors"))) == 2
    assert main(["convert", str(tmp_path / "folder"), str(tmp_path / target)]) == 0
    assert "(Hugging Face folder) ->" in capsys.readouterr().out
    loaded = jaxstow.load(tmp_path / target, as_numpy=True)
    assert sorted(loaded) == ["embed", "head.bias"]
    np.testing.assert_array_equal(loaded["embed"], TREE["embed"])
    np.testing.assert_array_equal(loaded["head.bias"], TREE["head"]["bias"])


def test_a_folder_of_neither_kind_is_still_named_as_no_orbax_checkpoint(tmp_path: Path, capsys) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("nothing to convert")
    assert main(["convert", str(tmp_path / "notes"), str(tmp_path / "out.jxs")]) == 2
    assert "not an orbax checkpoint" in capsys.readouterr().err and not (tmp_path / "out.jxs").exists()


def test_a_tensor_that_a_shard_holds_and_the_index_leaves_out_is_named_as_left_out(tmp_path: Path, capsys) -> None:
    import json

    jaxstow.save(tmp_path / "source.jxs", TREE)
    jaxstow.export_safetensors(tmp_path / "source.jxs", tmp_path / "folder")  # one shard, named for "embed" too
    index_path = tmp_path / "folder" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = index["weight_map"].pop("head.bias")  # an index edited by hand, or of another export
    index_path.write_text(json.dumps(index))
    assert main(["convert", str(tmp_path / "folder"), str(tmp_path / "model.jxs")]) == 0
    assert capsys.readouterr().err == (
        f"note: {tmp_path / 'folder' / shard}: holds 'head.bias', which model.safetensors.index.json does not map: "
        "every load leaves it out, and so does this conversion\n"
    )
    assert sorted(jaxstow.load(tmp_path / "model.jxs")) == ["embed"]
