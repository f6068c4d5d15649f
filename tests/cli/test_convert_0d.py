"""``jaxstow convert`` of a tree with 0-d leaves to plain safetensors and npz: each keeps its shape ``()``."""

from __future__ import annotations

import forked_cli
import numpy as np
import pytest
from safetensors.numpy import load_file


def test_convert_keeps_0d_leaves_0d(tmp_path):
    torch = pytest.importorskip("torch")
    norm = torch.nn.BatchNorm1d(3)
    norm.num_batches_tracked += 5
    torch.save({**norm.state_dict(), "scale": torch.tensor(0.5)}, tmp_path / "norm.pt")
    for name in ("norm.safetensors", "norm.npz"):
        done = forked_cli.jaxstow_command("convert", tmp_path / "norm.pt", tmp_path / name)
        assert done.returncode == 0, done.stderr
    plain = load_file(str(tmp_path / "norm.safetensors"))
    with np.load(tmp_path / "norm.npz", allow_pickle=False) as archive:
        archived = {name: archive[name] for name in archive.files}
    for converted in (plain, archived):
        assert converted["num_batches_tracked"].shape == () and int(converted["num_batches_tracked"]) == 5
        assert converted["scale"].shape == () and float(converted["scale"]) == 0.5
        assert converted["running_mean"].shape == (3,)
