"""An equinox stream loaded into a ``like`` whose number leaves are of another type than those saved (the model built
with ``Dropout(0)``, saved with ``Dropout(0.25)``): equinox would cast 0.25 to ``int`` and give 0; jaxstow refuses it,
naming the leaf, and loads the numbers a cast keeps as they are. The same for the 64-bit arrays of a stream saved
with jax's 64-bit mode on, loaded into a ``like`` of 32-bit jax arrays: jax would cast them, silently."""

from __future__ import annotations

import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow.errors import FormatError


class _Block(eqx.Module):
    linear: eqx.nn.Linear
    dropout: eqx.nn.Dropout
    steps: int


def _block(rate: float, steps: int, seed: int) -> _Block:
    return _Block(eqx.nn.Linear(2, 2, key=jax.random.key(seed)), eqx.nn.Dropout(rate), steps)


def test_a_number_that_likes_type_would_change_is_refused_naming_its_leaf(tmp_path):
    eqx.tree_serialise_leaves(tmp_path / "block.eqx", _block(0.25, 3, seed=0))
    with pytest.raises(FormatError) as info:
        jaxstow.load(tmp_path / "block.eqx", like=_block(0, 0, seed=1), from_format="equinox")
    assert info.value.path == "dropout/p" and info.value.file == str(tmp_path / "block.eqx")
    assert "holds 0.25 here, which like's int leaf would turn into 0: give like a float here" in str(info.value)


def test_numbers_that_likes_types_hold_as_saved_load(tmp_path):
    eqx.tree_serialise_leaves(tmp_path / "block.eqx", _block(0.0, 3, seed=0))
    loaded = jaxstow.load(tmp_path / "block.eqx", like=_block(0.5, 0.0, seed=1), from_format="equinox")
    assert loaded.dropout.p == 0.0 and loaded.steps == 3.0
    assert (loaded.linear.weight == _block(0.0, 3, seed=0).linear.weight).all()


def _saved_with_64_bits(path, arrays: str) -> None:
    """An equinox stream written by a process with jax's 64-bit mode on, of ``arrays`` (Python source)."""
    source = (
        "import sys, jax; jax.config.update('jax_enable_x64', True); import equinox as eqx, jax.numpy as jnp; "
        f"eqx.tree_serialise_leaves(sys.argv[1], {arrays})"
    )
    subprocess.run([sys.executable, "-c", source, str(path)], check=True)


@pytest.mark.parametrize(
    ("arrays", "path", "shown"),
    [
        (
            "{'n': jnp.array([2**40 + 1, 7]), 'w': jnp.array([0.5])}",
            "n",
            "int64 here, which like's int32 leaf would change (1099511627777 into 1)",
        ),
        (
            "{'n': jnp.array([7]), 'w': jnp.array([0.5, 1e40])}",
            "w",
            "float64 here, which like's float32 leaf would change (1e+40 into inf)",
        ),
    ],
)
def test_a_64_bit_array_that_a_32_bit_like_would_change_is_refused_naming_its_leaf(tmp_path, arrays, path, shown):
    _saved_with_64_bits(tmp_path / "x64.eqx", arrays)
    like = {"n": jax.ShapeDtypeStruct((2 if path == "n" else 1,), jnp.int32), "w": jnp.zeros(1 if path == "n" else 2)}
    with pytest.raises(FormatError) as info:  # equinox gives 1 and inf: jax casts the 64 bits away, silently
        jaxstow.load(tmp_path / "x64.eqx", like=like, from_format="equinox")
    assert info.value.path == path and info.value.file == str(tmp_path / "x64.eqx")
    assert f"the equinox stream holds {shown}: turn on jax's 64-bit mode" in str(info.value)


def test_64_bit_arrays_that_32_bits_hold_as_saved_load(tmp_path):
    _saved_with_64_bits(tmp_path / "x64.eqx", "{'n': jnp.array([2**30, -7]), 'w': jnp.array([0.5, jnp.nan, -jnp.inf])}")
    loaded = jaxstow.load(
        tmp_path / "x64.eqx", like={"n": jnp.zeros(2, jnp.int32), "w": jnp.zeros(3)}, from_format="equinox"
    )
    assert loaded["n"].dtype == jnp.int32 and loaded["n"].tolist() == [2**30, -7]
    assert loaded["w"].dtype == jnp.float32 and str(loaded["w"].tolist()) == "[0.5, nan, -inf]"
