"""``jaxstow diff`` says "the same" only for files that load as the same tree, bit for bit: integers are compared exactly in their
own dtype, value leaves with their types, and the stored structures (kinds of node, classes, their static data) node
by node, each place they differ named."""

from __future__ import annotations

import json

import equinox as eqx
import forked_cli
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow.cli import main
from jaxstow.cli.diff import compare_arrays


class Block(eqx.Module):
    w: jax.Array
    activation: str = eqx.field(static=True)
    heads: int = eqx.field(static=True)


def _diff(tmp_path, a, b, *options):
    jaxstow.save(tmp_path / "a.jxs", a)
    jaxstow.save(tmp_path / "b.jxs", b)
    return main(["diff", *options, str(tmp_path / "a.jxs"), str(tmp_path / "b.jxs")])


def _rows(capsys):
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("a", "b", "row"),
    [
        (
            np.array([2**53, 2**62], np.int64),
            np.array([2**53 + 1, 2**62 + 1], np.int64),
            "values differ: 2 of 2 elements, max |A - B| = 1",
        ),
        (np.array([2**64 - 1], np.uint64), np.array([2**64 - 2], np.uint64), "max |A - B| = 1"),
        (
            np.array([-(2**63), 5], np.int64),
            np.array([2**63 - 1, 5], np.int64),
            "values differ: 1 of 2 elements, max |A - B| = 18446744073709551615",
        ),
        (
            np.array([0, 2**64 - 1], np.uint64),
            np.array([2**64 - 1, 0], np.uint64),
            "max |A - B| = 18446744073709551615",
        ),
        (np.array([True, False]), np.array([True, True]), "values differ: 1 of 2 elements, max |A - B| = 1"),
        (np.array([-128, 1], np.int8), np.array([127, 1], np.int8), "max |A - B| = 255"),
    ],
)
def test_integers_beyond_float64_are_compared_exactly(tmp_path, capsys, a, b, row):
    assert _diff(tmp_path, {"x": a}, {"x": b}) == 1
    out = _rows(capsys)
    assert out[1].startswith("x ") and out[1].endswith(row) and out[-1] == "1 of 1 leaves differ"
    assert compare_arrays(a, a.copy()) is None


@pytest.mark.parametrize(("a", "b"), [(1, True), (0, False), (1, 1.0), ([1, 2], (1, 2)), ({"k": 1}, {"k": True})])
def test_value_leaves_differ_by_type(tmp_path, capsys, a, b):
    assert _diff(tmp_path, {"flag": a}, {"flag": b}) == 1
    assert "differ" in _rows(capsys)[-1]


def test_equal_values_and_structures_are_the_same(tmp_path, capsys):
    tree = {"step": np.array([2**62 + 1], np.int64), "flag": True, "m": Block(jnp.ones(2), "relu", 4), "no": None}
    assert _diff(tmp_path, tree, tree) == 0
    assert _rows(capsys) == ["the same: 3 leaves"]


def test_static_hyperparameters_that_differ_are_named(tmp_path, capsys):
    assert _diff(tmp_path, {"m": Block(jnp.ones(2), "relu", 4)}, {"m": Block(jnp.ones(2), "tanh", 8)}) == 1
    out = _rows(capsys)
    assert (
        out[1]
        == "m     structure differs: static data of test_diff_exact.Block: activation 'relu' -> 'tanh', heads 4 -> 8"
    )
    assert out[-2:] == ["the structure differs in 1 place", "0 of 1 leaves differ"]


@pytest.mark.parametrize(
    ("a", "b", "row"),
    [
        (
            Block(jnp.ones(2), "relu", 4),
            {"w": jnp.ones(2)},
            "(root)  structure differs: test_diff_exact.Block in A, a dict in B",
        ),
        (
            {"x": (np.ones(1), np.ones(1))},
            {"x": [np.ones(1), np.ones(1)]},
            "x     structure differs: a tuple in A, a list in B",
        ),
        ({"x": np.ones(1), "mask": None}, {"x": np.ones(1)}, "mask  structure differs: None only in A"),
        ({"x": np.ones(1)}, {"x": np.ones(1), "opt": {}}, "opt   structure differs: an empty dict only in B"),
        ({"x": [np.ones(1), None]}, {"x": [np.ones(1), ()]}, "x/1   structure differs: None in A, an empty tuple in B"),
    ],
)
def test_structures_that_differ_with_the_same_leaves_are_named(tmp_path, capsys, a, b, row):
    assert _diff(tmp_path, a, b) == 1
    out = _rows(capsys)
    assert out[1] == row and out[-1].startswith("0 of ")
    assert _diff(tmp_path, a, b, "--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["same"] is False and report["same_structure"] is False
    assert [item["kind"] for item in report["differences"]] == ["structure"]


def test_a_leaf_only_in_one_file_is_one_row_not_two(tmp_path, capsys):
    assert _diff(tmp_path, {"x": np.ones(1), "y": np.ones(1)}, {"x": np.ones(1)}) == 1
    assert _rows(capsys)[1:] == ["y     only in A", "1 of 2 leaves differ"]


def test_a_key_and_its_key_data_differ(tmp_path, capsys):
    key = jax.random.key(1)
    assert _diff(tmp_path, {"k": key}, {"k": jax.random.key_data(key)}) == 1
    assert _rows(capsys)[1] == "k     a threefry2x32 PRNG key in A, an array in B"


def test_a_class_this_process_does_not_know_is_compared_by_its_stored_structure(tmp_path):
    """The command's own process has never imported this test module: the class is compared by name and position."""
    jaxstow.save(tmp_path / "a.jxs", Block(jnp.ones(2), "relu", 4))
    jaxstow.save(tmp_path / "b.jxs", Block(jnp.ones(2), "tanh", 4))
    done = forked_cli.jaxstow_command("diff", tmp_path / "a.jxs", tmp_path / "b.jxs")
    assert done.returncode == 1 and done.stderr == ""
    assert "(root)  structure differs: static data of test_diff_exact.Block: 1 'relu' -> 'tanh'" in done.stdout


def test_the_same_values_in_other_bytes_are_a_difference(tmp_path, capsys):
    # "the same" for -0.0 against 0.0 and NaNs of other payloads: a bitwise reproduction was reported reproduced.
    other_nan = np.array([0x7FC00001], np.uint32).view(np.float32)[0]
    a = np.array([0.0, np.nan, 1.0], np.float32)
    b = np.array([-0.0, other_nan, 1.0], np.float32)
    assert _diff(tmp_path, {"x": a}, {"x": b}) == 1
    out = _rows(capsys)
    assert out[1].endswith("the same values in other bytes: 2 of 3 elements (-0.0 for 0.0, or NaNs of other payloads)")
    assert out[-1] == "1 of 1 leaves differ"
