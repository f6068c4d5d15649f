"""An equinox stream loaded into a ``like`` whose number leaves are of another type than those saved (the model built
with ``Dropout(0)``, saved with ``Dropout(0.25)``): equinox would cast 0.25 to ``int`` and give 0; jaxstow refuses it,
naming the leaf, and loads the numbers a cast keeps as they are."""

from __future__ import annotations

import equinox as eqx
import jax
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
