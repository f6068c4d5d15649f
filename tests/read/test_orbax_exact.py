"""An orbax checkpoint read by jaxstow (``load(from_format="orbax")``, ``jaxstow convert``) gives back what was saved,
whatever jax's x64 mode: 64-bit arrays and scalars exact as numpy, strings as ``str``, typed PRNG keys as keys; on the
way to jax, values that x64 off would wrap are refused, as for a jaxstow file."""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._read.orbax_steps import read_checkpoint
from jaxstow.cli import main
from jaxstow.errors import RequestError

ocp = pytest.importorskip("orbax.checkpoint")

WIDE = {
    "step": np.array([2**40 + 1, 7], np.int64),
    "lr": np.array([0.1], np.float64),
    "hash": np.array([2**64 - 1], np.uint64),
    "z": np.array([0.1 + 0.2j], np.complex128),
    "n": 2**40 + 1,
    "half": jnp.array([1.5, -2.0], jnp.bfloat16),
}


def _save(folder, tree, checkpointer=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with checkpointer or ocp.StandardCheckpointer() as saver:
            saver.save(os.path.abspath(folder), tree)
    return folder


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    assert not jax.config.jax_enable_x64  # what the bug needs: orbax restored jax arrays, narrowed to 32 bits
    return _save(tmp_path_factory.mktemp("orbax") / "wide", WIDE)


def _assert_exact(got):
    for name in ("step", "lr", "hash", "z", "half"):
        assert isinstance(got[name], np.ndarray), name
        assert got[name].dtype == np.asarray(WIDE[name]).dtype, name
        assert got[name].tobytes() == np.asarray(WIDE[name]).tobytes(), name
    assert got["n"] == 2**40 + 1 and type(got["n"]) is int


def test_as_numpy_gives_every_64_bit_value_exact_in_its_own_dtype(wide):
    _assert_exact(jaxstow.load(wide, from_format="orbax", as_numpy=True))
    got = read_checkpoint(str(wide))
    _assert_exact(got)
    assert all(got[name].flags.writeable for name in ("step", "lr", "hash", "z"))


def test_convert_writes_the_64_bit_values_exact(wide, tmp_path, capsys):
    assert main(["convert", str(wide), str(tmp_path / "wide.jxs")]) == 0
    _assert_exact(jaxstow.load(tmp_path / "wide.jxs", as_numpy=True))
    assert main(["convert", str(wide), str(tmp_path / "wide.npz")]) == 0
    with np.load(tmp_path / "wide.npz") as plain:
        assert plain["step"].tolist() == [2**40 + 1, 7] and plain["hash"].tolist() == [2**64 - 1]


def test_loading_into_jax_refuses_integers_that_x64_off_would_wrap(wide, tmp_path):
    with pytest.raises(RequestError, match=r"leaf '(step|hash)' of .*wide: holds u?int64 values beyond 32 bits"):
        jaxstow.load(wide, from_format="orbax")
    small = _save(tmp_path / "small", {"step": np.array([3, 7], np.int64), "lr": np.array([0.5], np.float64)})
    got = jaxstow.load(small, from_format="orbax")
    assert isinstance(got["step"], jax.Array) and got["step"].tolist() == [3, 7]
    assert got["lr"].tolist() == [0.5]


def test_a_string_leaf_comes_back_a_str(tmp_path):
    folder = _save(tmp_path / "named", {"name": "hello", "w": np.ones(2, np.float32)}, ocp.PyTreeCheckpointer())
    got = jaxstow.load(folder, from_format="orbax", as_numpy=True)
    assert got["name"] == "hello" and type(got["name"]) is str
    assert jaxstow.load(folder, from_format="orbax")["name"] == "hello"
    assert main(["convert", str(folder), str(tmp_path / "named.jxs")]) == 0
    assert jaxstow.load(tmp_path / "named.jxs", as_numpy=True)["name"] == "hello"


def test_a_typed_prng_key_comes_back_a_key_of_its_implementation(tmp_path):
    keys = {"rng": jax.random.key(3), "nested": {"rbg": jax.random.key(5, impl="rbg")}, "raw": jax.random.PRNGKey(1)}
    folder = _save(tmp_path / "keys", keys)
    got = read_checkpoint(str(folder))
    for name, restored, saved in [
        ("rng", got["rng"], keys["rng"]),
        ("rbg", got["nested"]["rbg"], keys["nested"]["rbg"]),
    ]:
        assert jax.dtypes.issubdtype(restored.dtype, jax.dtypes.prng_key), name
        assert str(jax.random.key_impl(restored)) == str(jax.random.key_impl(saved)), name
        assert np.array_equal(jax.random.key_data(restored), jax.random.key_data(saved)), name
    assert got["raw"].dtype == np.uint32 and got["raw"].tolist() == [0, 1]  # an old-style key is its uint32 data
    assert main(["convert", str(folder), str(tmp_path / "keys.jxs")]) == 0
    converted = jaxstow.load(tmp_path / "keys.jxs")
    assert jax.random.key_impl(converted["rng"]) == jax.random.key_impl(keys["rng"])
    assert np.array_equal(jax.random.key_data(converted["nested"]["rbg"]), jax.random.key_data(keys["nested"]["rbg"]))
    loaded = jaxstow.load(folder, from_format="orbax")
    assert jax.random.key_impl(loaded["rng"]) == jax.random.key_impl(keys["rng"])
    assert np.array_equal(jax.random.key_data(loaded["rng"]), jax.random.key_data(keys["rng"]))
