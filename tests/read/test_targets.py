"""Restoring into abstract and partial targets, with casts and path selections (``jaxstow.load``)."""

from __future__ import annotations

import functools
import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from counting import CountingSource

import jaxstow
from jaxstow._storage.opening import open_source
from jaxstow.errors import RequestError, SelectionError, StructureMismatchError


def _state():
    return {
        "params": {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4, jnp.bfloat16)},
        "opt": {"mu": jnp.full((256, 256), 0.5), "count": jnp.int8(3)},
        "step": 7,
        "key": jax.random.key(1),
    }


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "state.jxs"
    jaxstow.save(path, _state())
    return path


def test_shape_dtype_struct_targets_mixed_with_arrays(saved):
    state = _state()
    like = jax.tree.map(lambda x: x, state)
    like["params"]["w"] = jax.ShapeDtypeStruct((3, 4), jnp.float32)
    like["params"]["b"] = np.zeros(4, jnp.bfloat16)
    like["opt"]["mu"] = jax.ShapeDtypeStruct(
        (256, 256), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[1])
    )
    like["key"] = jax.eval_shape(lambda: jax.random.key(0))
    restored = jaxstow.load(saved, like=like)
    assert isinstance(restored["params"]["w"], jax.Array) and isinstance(restored["params"]["b"], np.ndarray)
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
    assert restored["opt"]["mu"].devices() == {jax.devices()[1]}
    assert restored["step"] == 7
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))


def test_the_abstract_tree_of_a_file_is_a_target(saved):
    with jaxstow.open(saved) as reader:
        abstract = reader.abstract
    assert abstract["params"]["w"] == jax.ShapeDtypeStruct((3, 4), jnp.float32)
    restored = jaxstow.load(saved, like=abstract)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(_state()), strict=True):
        if isinstance(want, jax.Array) and jnp.issubdtype(want.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        np.testing.assert_array_equal(got, want)


def test_equinox_model_restored_into_filter_eval_shape(tmp_path):
    make = lambda: eqx.nn.MLP(3, 2, width_size=8, depth=2, key=jax.random.key(0))  # noqa: E731
    model = make()
    jaxstow.save(tmp_path / "mlp.jxs", model)
    abstract = eqx.filter_eval_shape(make)
    restored = jaxstow.load(tmp_path / "mlp.jxs", like=abstract)
    x = jnp.ones(3)
    np.testing.assert_array_equal(restored(x), model(x))


def test_flax_nnx_state_restored_into_nnx_eval_shape(tmp_path):
    nnx = pytest.importorskip("flax.nnx")

    make = lambda: nnx.Linear(3, 4, rngs=nnx.Rngs(0))  # noqa: E731
    model = make()
    jaxstow.save(tmp_path / "linear.jxs", nnx.state(model))
    abstract = nnx.eval_shape(make)
    graphdef, abstract_state = nnx.split(abstract)
    restored = jaxstow.load(tmp_path / "linear.jxs", like=abstract_state)
    x = jnp.ones((2, 3))
    np.testing.assert_array_equal(nnx.merge(graphdef, restored)(x), model(x))


def test_partial_target_leaves_the_rest_unread(saved):
    source = CountingSource(open_source(str(saved)))
    like = {"params": {"w": jax.ShapeDtypeStruct((3, 4), jnp.float32)}}
    restored = jaxstow.load(source, like=like, partial=True)
    np.testing.assert_array_equal(restored["params"]["w"], _state()["params"]["w"])
    assert source.bytes_read < 16 * 1024  # the header and w, not the 256 KiB of opt/mu


def test_a_subset_without_partial_lists_every_unexpected_leaf(saved):
    with pytest.raises(StructureMismatchError) as raised:
        jaxstow.load(saved, like={"params": {"w": jnp.zeros((3, 4))}})
    problems = raised.value.problems
    assert len(problems) == 5 and all("partial=True" in problem for problem in problems)
    assert any("'opt/mu'" in problem for problem in problems)


def test_missing_leaves_stay_an_error_with_partial(saved):
    like = {"params": {"w": jnp.zeros((3, 4)), "v": jnp.zeros(2)}, "extra": jax.ShapeDtypeStruct((1,), jnp.int32)}
    with pytest.raises(StructureMismatchError) as raised:
        jaxstow.load(saved, like=like, partial=True)
    assert sorted(raised.value.problems) == [
        "'extra': missing from the file (expected int32[1])",
        "'params/v': missing from the file (expected float32[2])",
    ]
    assert str(saved) in str(raised.value)


def test_select_restores_only_matching_leaves(saved):
    source = CountingSource(open_source(str(saved)))
    restored = jaxstow.load(source, select=["params/**", "step"])
    assert sorted(restored) == ["params", "step"] and sorted(restored["params"]) == ["b", "w"]
    assert source.bytes_read < 16 * 1024
    only_b = jaxstow.load(saved, select="params/b")
    assert jax.tree.structure(only_b) == jax.tree.structure({"params": {"b": 0}})


def test_select_inside_a_module_leaves_none_where_a_leaf_was_not_read(tmp_path):
    model = eqx.nn.Linear(2, 3, key=jax.random.key(0))
    jaxstow.save(tmp_path / "linear.jxs", {"model": model, "other": jnp.ones(2)})
    restored = jaxstow.load(tmp_path / "linear.jxs", select=["model/weight"])
    assert list(restored) == ["model"] and restored["model"].bias is None
    np.testing.assert_array_equal(restored["model"].weight, model.weight)


def test_select_drops_unchosen_keys_of_dicts_in_lists_and_subtrees_left_with_no_leaf(tmp_path):
    # The dicts inside a list kept their unchosen keys as None; a dict whose leaves were all left out stayed, with
    # its children that hold none ({'count': None, 'hist': {}}).
    tree = {
        "layers": [{"w": np.ones(1), "b": np.zeros(1)}, {"w": np.full(1, 3.0), "b": np.zeros(1)}],
        "opt": {"count": None, "hist": {}, "mu": np.ones(2)},
        "params": {"w": np.ones(1), "cfg": None},
        "ema": None,  # a sibling holding no leaf, not chosen: it stayed too
        "extra": {},
    }
    jaxstow.save(tmp_path / "tree.jxs", tree)
    weights = jaxstow.load(tmp_path / "tree.jxs", select="layers/*/w", as_numpy=True)
    assert jax.tree.structure(weights) == jax.tree.structure({"layers": [{"w": 0}, {"w": 0}]})
    first = jaxstow.load(tmp_path / "tree.jxs", select="layers/0", as_numpy=True)
    assert first["layers"][1] is None and sorted(first["layers"][0]) == ["b", "w"]
    params = jaxstow.load(tmp_path / "tree.jxs", select="params", as_numpy=True)
    assert list(params) == ["params"] and params["params"]["cfg"] is None  # chosen with its subtree


def test_a_like_with_two_leaves_of_one_path_is_refused(tmp_path):
    # 'a/b' as a key and as a nested path: both were filled from the one file leaf.
    jaxstow.save(tmp_path / "tree.jxs", {"a": {"b": np.ones(1), "c": np.zeros(1)}})
    like = {"a/b": np.zeros(1), "a": {"b": np.zeros(1), "c": np.zeros(1)}}
    with pytest.raises(StructureMismatchError, match="'a/b': like has two leaves of this path"):
        jaxstow.load(tmp_path / "tree.jxs", like=like)


def test_select_wildcards(saved):
    restored = jaxstow.load(saved, select=["*/m?", "**/count"], as_numpy=True)
    assert sorted(restored["opt"]) == ["count", "mu"] and "params" not in restored


def test_a_pattern_matching_nothing_is_an_error_naming_it(saved):
    with pytest.raises(SelectionError, match=r"'parms/\*\*' matches no leaf") as raised:
        jaxstow.load(saved, select=["params/**", "parms/**"])
    assert raised.value.file == str(saved)


def test_cast_between_floats_and_widening_ints(saved):
    like = {"params": {"w": jax.ShapeDtypeStruct((3, 4), jnp.bfloat16), "b": np.zeros(4, np.float32)}}
    like["opt"] = {"count": np.int32(0), "mu": jax.ShapeDtypeStruct((256, 256), jnp.float16)}
    restored = jaxstow.load(saved, like=like, cast=True, partial=True)
    assert restored["params"]["w"].dtype == jnp.bfloat16 and restored["params"]["b"].dtype == np.float32
    assert type(restored["opt"]["count"]) is np.int32 and restored["opt"]["count"] == 3
    np.testing.assert_array_equal(restored["params"]["w"], _state()["params"]["w"].astype(jnp.bfloat16))


def test_a_big_endian_array_loads_back_into_itself(tmp_path):
    # The file holds it as its little-endian equal: a like of ">f4" asks for float32, with or without cast.
    big = {"a": np.arange(6, dtype=">f4"), "b": np.arange(3, dtype=">i8")}
    jaxstow.save(tmp_path / "big.jxs", big)
    targets = [big, {"a": jax.ShapeDtypeStruct((6,), np.dtype(">f4")), "b": np.zeros(3, ">i8")}]
    for like in targets:
        for cast in (False, True):
            restored = jaxstow.load(tmp_path / "big.jxs", like=like, cast=cast)
            assert [np.dtype(leaf.dtype) for leaf in (restored["a"], restored["b"])] == [np.float32, np.int64]
            np.testing.assert_array_equal(restored["a"], big["a"])
            np.testing.assert_array_equal(restored["b"], big["b"])


def test_a_dtype_mismatch_suggests_cast(saved):
    like = {"params": {"w": jax.ShapeDtypeStruct((3, 4), jnp.bfloat16)}}
    with pytest.raises(StructureMismatchError, match="pass cast=True to convert it"):
        jaxstow.load(saved, like=like, partial=True)


def test_cast_refuses_to_lose_values_between_kinds(saved):
    like = {"params": {"w": jax.ShapeDtypeStruct((3, 4), jnp.int32)}, "opt": {"count": jnp.int4(0)}}
    with pytest.raises(StructureMismatchError) as raised:
        jaxstow.load(saved, like=like, partial=True, cast=True)
    assert sorted(raised.value.problems) == [
        "'opt/count': the file has int8[], expected int4[]; cast=True does not turn int8 into int4, which would lose "
        "values",
        "'params/w': the file has float32[3, 4], expected int32[3, 4]; cast=True does not turn float32 into int32, "
        "which would lose values",
    ]


def test_options_that_do_not_go_together(saved):
    with pytest.raises(RequestError, match="select= chooses leaves without a template"):
        jaxstow.load(saved, like=_state(), select=["params"])
    with pytest.raises(RequestError, match="partial= and cast= work with like"):
        jaxstow.load(saved, partial=True)
    with pytest.raises(RequestError, match="as_numpy=True gives numpy arrays"):
        jaxstow.load(saved, as_numpy=True, sharding=jax.devices()[0])


class _Settings:
    """A plain class saved by its attributes."""

    def __init__(self, rate: float) -> None:
        self.rate = rate


def test_a_model_with_a_partial_or_a_saved_object_loads_back_into_itself():
    # A partial or an object the load rebuilds is never the like's own: "the file has functools.partial(...),
    # expected functools.partial(...)" for the very model saved.
    jaxstow.saveable(_Settings, name="tests.read.test_targets._Settings")
    activation = functools.partial(jax.nn.leaky_relu, negative_slope=0.2)
    model = eqx.nn.MLP(2, 2, 4, 1, activation=activation, key=jax.random.key(0))
    tree = {"model": model, "settings": _Settings(0.5), "f": activation}
    buffer = io.BytesIO()
    jaxstow.save(buffer, tree)
    for like in (tree, eqx.filter_eval_shape(lambda: tree)):
        buffer.seek(0)
        loaded = jaxstow.load(buffer, like=like)
        assert loaded["f"].keywords == {"negative_slope": 0.2} and loaded["settings"].rate == 0.5
    buffer.seek(0)
    with pytest.raises(StructureMismatchError, match=r"'f': the file has functools\.partial"):
        jaxstow.load(buffer, like={**tree, "f": functools.partial(jax.nn.gelu)})


@pytest.mark.timeout(120)  # a regular expression of the pattern backtracked through the key for hours
def test_a_pattern_of_many_stars_over_a_long_key_is_answered(tmp_path):
    jaxstow.save(tmp_path / "long.jxs", {"a" * 3000: np.ones(2), "weights": np.zeros(2)})  # a file's keys are anyone's
    with pytest.raises(SelectionError, match=r"'\*a\*a\*a\*weights' matches no leaf"):
        jaxstow.load(tmp_path / "long.jxs", select="*a*a*a*weights")
    assert list(jaxstow.load(tmp_path / "long.jxs", select=["**/" * 8 + "w*s"])) == ["weights"]
