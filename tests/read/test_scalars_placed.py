"""Python scalars restored into the weakly typed 0-d arrays ``jax.eval_shape`` makes of them land where ``sharding=``
says, as every restored array does, over four CPU devices (tests/conftest.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow.errors import ShardingError


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "state.jxs"
    jaxstow.save(path, {"lr": 0.5, "w": np.arange(4.0, dtype=np.float32)})
    return path


def _like(sharding=None):
    return {
        "lr": jax.ShapeDtypeStruct((), jnp.float32, weak_type=True, sharding=sharding),
        "w": jax.ShapeDtypeStruct((4,), jnp.float32),
    }


@pytest.mark.parametrize("spec_form", ["one", "tree", "function"])
def test_sharding_places_a_python_scalar_as_it_places_the_arrays(saved, spec_form):
    replicated = NamedSharding(jax.make_mesh((4,), ("x",)), P())
    spec = {
        "one": replicated,
        "tree": {"lr": replicated, "w": replicated},
        "function": lambda path, shape, dtype: replicated,
    }[spec_form]
    on_device_1 = SingleDeviceSharding(jax.devices()[1])
    restored = jaxstow.load(saved, like=_like(on_device_1), sharding=spec)  # sharding= wins over like's
    assert restored["lr"].sharding == replicated == restored["w"].sharding
    assert float(restored["lr"]) == 0.5 and restored["lr"].weak_type
    assert jax.jit(lambda lr, w: lr * w)(restored["lr"], restored["w"]).tolist() == [0.0, 0.5, 1.0, 1.5]


def test_a_python_scalar_lands_on_the_device_sharding_names(saved):
    device = jax.devices()[2]
    restored = jaxstow.load(saved, like=_like(), sharding=device)
    assert restored["lr"].devices() == {device} == restored["w"].devices()


def test_a_sharding_that_cannot_hold_a_python_scalar_is_refused_naming_it(saved):
    rows = NamedSharding(jax.make_mesh((4,), ("x",)), P("x"))
    with pytest.raises(ShardingError, match=r"leaf 'lr' of .*state.jxs: shape \[\] cannot be laid out"):
        jaxstow.load(saved, like=_like(), sharding=rows)
