"""Trees jax itself cannot flatten or read (mixed dict keys, deleted arrays) are refused naming the file and the place."""

from __future__ import annotations

import enum
import io
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow import CheckpointManager
from jaxstow._write import host_budget
from jaxstow.errors import ArgumentError


class Table(NamedTuple):
    rows: dict


def _deleted(shape=(3,)):
    array = jnp.ones(shape)
    jax.jit(lambda x: x * 2, donate_argnums=0)(array)
    assert array.is_deleted()
    return array


@pytest.mark.parametrize("suffix", ["model.jxs", "model.npz"])
def test_a_deleted_array_is_named_by_its_leaf_and_file(tmp_path, suffix):
    path = tmp_path / suffix
    with pytest.raises(ArgumentError) as caught:
        jaxstow.save(path, {"layers": [jnp.zeros(1), {"kernel": _deleted((2, 3))}]})
    assert caught.value.path == "layers/1/kernel" and caught.value.file == str(path)
    assert str(caught.value) == (
        f"cannot save leaf 'layers/1/kernel' of {path}: its array (float32[2, 3]) has been deleted, as donating it to "
        "a jitted function (donate_argnums) does: save it before the call that donates it, or save what the call "
        "returned"
    )
    assert not path.exists()
    with pytest.raises(ArgumentError, match=r"^cannot save leaf 'w' of <BytesIO>: its array \(float32\[3\]\)"):
        jaxstow.save(io.BytesIO(), {"w": _deleted()})


def test_a_deleted_array_taken_down_the_accelerator_path_is_named_too(tmp_path, monkeypatch):
    monkeypatch.setattr(host_budget, "_HOST_PLATFORMS", frozenset())
    monkeypatch.setattr(host_budget, "_accelerators_present", lambda: True)
    with pytest.raises(ArgumentError, match=r"^cannot save leaf 'b/w' of .*model\.jxs: its array \(float32\[3\]\)"):
        jaxstow.save(tmp_path / "model.jxs", {"a": jnp.ones(2), "b": {"w": _deleted()}})
    with CheckpointManager(tmp_path / "run") as manager, pytest.raises(ArgumentError, match="leaf 'b/w'"):
        manager.save(1, {"params": {"a": jnp.ones(2), "b": {"w": _deleted()}}})
        manager.wait_until_finished()


def test_a_deleted_array_in_a_checkpoint_is_named_by_its_leaf_and_file(tmp_path):
    with CheckpointManager(tmp_path / "run") as manager, pytest.raises(ArgumentError) as caught:
        manager.save(1, {"params": {"w": _deleted()}})
        manager.wait_until_finished()
    assert caught.value.path == "w" and "params" in caught.value.file
    assert "has been deleted" in str(caught.value)


def test_a_deleted_array_saved_as_the_whole_tree_is_named_as_the_root(tmp_path):
    with pytest.raises(
        ArgumentError, match=r"^cannot save the root of the tree of .*w\.jxs: its array \(float32\[3\]\)"
    ):
        jaxstow.save(tmp_path / "w.jxs", _deleted())
    with CheckpointManager(tmp_path / "run") as manager, pytest.raises(ArgumentError) as caught:
        manager.save(1, {"w": _deleted()})  # an item that is one array
        manager.wait_until_finished()
    assert str(caught.value).startswith("cannot save the root of the tree of "), caught.value


@pytest.mark.parametrize(
    ("tree", "where", "kinds"),
    [
        ({1: jnp.ones(1), "a": jnp.ones(1)}, "the dict at the root of the tree", "int and str"),
        ({"m": {True: jnp.ones(1), "a": jnp.ones(1)}}, "the dict at 'm'", "bool and str"),
        ([{"ok": 1}, {"x": {1: 2, "b": 3}}], "the dict at '1/x'", "int and str"),
        ({"table": Table({0: jnp.ones(1), "bias": jnp.ones(1)})}, "the dict at 'table/rows'", "int and str"),
    ],
)
def test_a_dict_whose_keys_jax_cannot_sort_is_named_with_the_fix(tmp_path, tree, where, kinds):
    path = tmp_path / "model.jxs"
    with pytest.raises(ArgumentError) as caught:
        jaxstow.save(path, tree)
    assert str(caught.value).startswith(f"cannot save {where} of {path}: its keys mix {kinds}, which jax cannot sort")
    assert "{str(key): value for key, value in d.items()}" in str(caught.value)
    assert caught.value.file == str(path) and not path.exists()
    with CheckpointManager(tmp_path / "run") as manager, pytest.raises(ArgumentError, match=f"its keys mix {kinds}"):
        manager.save(1, {"params": tree})
        manager.wait_until_finished()


class _Split(enum.Enum):  # members with no order among them
    TRAIN = "train"
    TEST = "test"


def test_a_dict_keyed_by_members_of_an_enum_is_told_they_have_no_order_not_that_they_mix(tmp_path):
    # was: "its keys mix _Split, which jax cannot sort", for keys all of one class
    path = tmp_path / "model.jxs"
    with pytest.raises(ArgumentError) as caught:
        jaxstow.save(path, {"losses": {_Split.TRAIN: jnp.ones(1), _Split.TEST: jnp.zeros(1)}})
    assert str(caught.value).startswith(
        f"cannot save the dict at 'losses' of {path}: its keys are of the class _Split, which has no order for jax "
        "to sort them by"
    )
    assert "{str(key): value for key, value in d.items()}" in str(caught.value) and not path.exists()
