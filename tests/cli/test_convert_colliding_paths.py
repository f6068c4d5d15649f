"""``jaxstow convert`` of a tree whose two leaves have one path (the key ``"x/y"`` beside ``"y"`` under ``"x"``): no
file keeps them apart, so the command refuses it in one line naming the source and the path, and writes nothing."""

from __future__ import annotations

import forked_cli
import pytest


@pytest.mark.parametrize("name", ["out.safetensors", "out.npz", "out.jxs"])
def test_a_torch_state_dict_whose_keys_meet_is_refused_in_every_format(tmp_path, name):
    torch = pytest.importorskip("torch")
    torch.save({"x/y": torch.ones(3), "x": {"y": torch.zeros(3)}}, tmp_path / "sd.pt")
    done = forked_cli.jaxstow_command("convert", tmp_path / "sd.pt", tmp_path / name)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"jaxstow convert: leaf 'x/y' of {tmp_path / 'sd.pt'}: leaves 0 and 1 of the tree both have the path 'x/y'; "
        "rename a key so that every leaf has its own path"
    ]
    assert not (tmp_path / name).exists()


def test_a_flax_msgpack_file_whose_keys_meet_is_refused(tmp_path):
    serialization = pytest.importorskip("flax.serialization")
    import numpy as np

    (tmp_path / "params.msgpack").write_bytes(serialization.to_bytes({"a/b": np.ones(2), "a": {"b": np.zeros(2)}}))
    done = forked_cli.jaxstow_command("convert", tmp_path / "params.msgpack", tmp_path / "params.safetensors")
    assert done.returncode == 2 and "leaf 'a/b' of " in done.stderr and "both have the path 'a/b'" in done.stderr
    assert not (tmp_path / "params.safetensors").exists()
