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


@pytest.mark.parametrize("shape", OVERFLOWING)
@pytest.mark.parametrize("as_numpy", [True, False])
def test_a_raw_leaf_whose_shape_overflows(shape, as_numpy):
    tensors, manifest, data = _saved({"w": np.zeros(0, "complex128")})  # complex128 is stored as raw bytes
    (entry,) = manifest["leaves"]
    entry["shape"] = shape
    forged = forge_native(tensors, json.dumps(manifest), data)
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


def test_a_sharded_leaf_whose_global_shape_overflows():
    tensors, manifest, data = _saved({"w": np.zeros((0, 4), np.float32)})
    (entry,) = manifest["leaves"]
    entry.update(kind="sharded", dtype="float32", shape=[0, 2**62], shards=[])
    with pytest.raises(FormatError, match="leaf 'w'"):
        jaxstow.load(io.BytesIO(forge_native(tensors, json.dumps(manifest), data)), as_numpy=True)
