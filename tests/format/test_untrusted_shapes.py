"""Crafted shapes whose byte size overflows what an array can hold are refused by the header checks, before numpy
sees them: a jaxstow error naming the leaf, never numpy's ``array is too big``."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import jaxstow
from jaxstow.errors import FormatError
from reliability.forge import forge_native, split_native

OVERFLOWING = [[0, 2**62], [2**62, 0, 4], [0, 2**61, 8], [3_037_000_500, 3_037_000_500], [1] * 70]


def _saved(tree) -> tuple[dict, dict, bytes]:
    buffer = io.BytesIO()
    jaxstow.save(buffer, tree)
    tensors, manifest, data = split_native(buffer.getvalue())
    assert manifest is not None
    return tensors, json.loads(manifest), data


def _one_leaf(manifest: dict, version: int, entry: dict) -> dict:
    """``manifest`` of a one-leaf tree, its leaf described by ``entry`` (version 2) or by its columns (version 3)."""
    common = {key: manifest[key] for key in ("format", "structure", "metadata")}
    if version == 2:
        return {**common, "version": 2, "leaves": [{"path": "w", "xxh3": manifest["xxh3"][0], **entry}]}
    kind = {"array": "a", "sharded": "s"}[entry["kind"]]
    details = {key: value for key, value in entry.items() if key != "kind"}
    xxh3 = [] if kind == "s" else manifest["xxh3"]
    return {**common, "version": 3, "paths": ["w"], "kinds": kind, "xxh3": xxh3, "details": {"0": details}}


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("shape", OVERFLOWING)
@pytest.mark.parametrize("as_numpy", [True, False])
def test_a_raw_leaf_whose_shape_overflows(shape, as_numpy, version):
    tensors, manifest, data = _saved({"w": np.zeros(0, "complex128")})  # complex128 is stored as raw bytes
    forged_manifest = _one_leaf(manifest, version, {"kind": "array", "dtype": "complex128", "shape": shape})
    forged = forge_native(tensors, json.dumps(forged_manifest), data)
    with pytest.raises(FormatError, match="leaf 'w'") as raised:
        jaxstow.load(io.BytesIO(forged), as_numpy=as_numpy)
    assert "2**63 bytes" in str(raised.value) or "axes" in str(raised.value)


@pytest.mark.parametrize("shape", OVERFLOWING)
def test_a_safetensors_tensor_whose_shape_overflows(shape):
    tensors, manifest, data = _saved({"w": np.zeros(0, np.float32)})
    tensors["w"]["shape"] = shape
    forged = forge_native(tensors, json.dumps(manifest), data)
    with pytest.raises(FormatError, match="leaf 'w'"):
        jaxstow.load(io.BytesIO(forged), as_numpy=True)
    with pytest.raises(FormatError, match="leaf 'w'"):
        jaxstow.open(io.BytesIO(forged))


@pytest.mark.parametrize("version", [2, 3])
def test_a_sharded_leaf_whose_global_shape_overflows(version):
    tensors, manifest, data = _saved({"w": np.zeros((0, 4), np.float32)})
    entry = {"kind": "sharded", "dtype": "float32", "shape": [0, 2**62], "shards": []}
    forged = forge_native(tensors, json.dumps(_one_leaf(manifest, version, entry)), data)
    with pytest.raises(FormatError, match="leaf 'w'"):
        jaxstow.load(io.BytesIO(forged), as_numpy=True)
