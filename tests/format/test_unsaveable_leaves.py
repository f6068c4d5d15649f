"""Leaves a file cannot hold as they are are refused at save, naming the leaf and what to save instead; none is saved
as something else."""

from __future__ import annotations

import collections
import io

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxstow
from jaxstow.errors import ArgumentError, FormatError, UnsaveableObjectError

SUFFIXES = ["model.jxs", "model.npz"]


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize(
    "masked",
    [np.ma.array([1.0, 2.0], mask=[0, 1]), np.ma.array([1.0, 2.0]), np.ma.masked],
    ids=["masked", "nothing masked", "the masked constant"],
)
def test_a_masked_array_is_refused_and_a_matrix_keeps_its_values(tmp_path, suffix, masked):
    path = tmp_path / suffix
    with pytest.raises(UnsaveableObjectError) as caught:
        jaxstow.save(path, {"layers": [np.ones(2), masked]})
    assert caught.value.path == "layers/1" and caught.value.file == str(path)
    assert "a numpy masked array, whose mask a file does not hold: save its .data and .mask as two leaves" in str(
        caught.value
    )
    assert ".filled(value)" in str(caught.value)
    assert not path.exists()
    jaxstow.save(path, {"m": np.matrix([[1.0, 2.0], [3.0, 4.0]])})
    loaded = jaxstow.load(path, as_numpy=True)["m"]
    assert type(loaded) is np.ndarray and loaded.tolist() == [[1.0, 2.0], [3.0, 4.0]]


@pytest.mark.parametrize(
    ("leaf", "advice"),
    [
        (np.array([1, "a"], dtype=object), r"an array of Python objects \(dtype object\), .*save them as a list"),
        (
            np.zeros(2, dtype=[("x", "i4"), ("y", "f4")]),
            r"an array of the structured dtype .*save each field as a leaf of its own",
        ),
        (np.rec.array([(1, 2.0)], dtype=[("x", "i4"), ("y", "f4")]), "an array of the structured dtype"),
        (np.array(["ab", "c"]), r"an array of dtype <U2, strings or raw bytes, .*save \.tolist\(\) of it"),
        (np.array(["2020-01-01"], dtype="datetime64[D]"), r"an array of dtype datetime64\[D\].*\.astype\(\.\.\.\)"),
        (np.void(b"ab"), r"a numpy scalar of dtype \|V2, strings or raw bytes"),
        # ml_dtypes' own outside the table (their kind is V): was "strings or raw bytes, ... save .tolist() of it"
        *(
            [(np.zeros(2, ml_dtypes.int1), r"an array of dtype int1, which a file does not store .*\.astype\(")]
            if hasattr(ml_dtypes, "int1")  # ml_dtypes 0.5 and later
            else []
        ),
        (np.zeros(1, dtype=[("x", "i4")])[0], "a numpy scalar of the structured dtype"),
        (np.bytes_(b"ab"), r"a numpy scalar of dtype \|S2"),
        (np.datetime64("2020-01-01"), r"a numpy scalar of dtype datetime64\[D\]"),
        (np.dtype(object), r"a dtype outside the table .*save its name, str\(dtype\)"),
    ],
    ids=lambda value: str(getattr(value, "dtype", value))[:24],
)
def test_a_dtype_a_file_does_not_store_is_refused_with_what_to_save(tmp_path, leaf, advice):
    path = tmp_path / "model.jxs"
    with pytest.raises(UnsaveableObjectError, match=advice) as caught:
        jaxstow.save(path, {"x": {"y": leaf}})
    assert caught.value.path == "x/y" and caught.value.file == str(path)
    assert "register it" not in str(caught.value)


class _Node:
    """A registered class saved by its attributes, whose children point back at their parent."""

    def __init__(self, parent: _Node | None = None) -> None:
        self.parent, self.children = parent, []


jaxstow.saveable(_Node, name="tests.unsaveable_leaves.Node")


def _cyclic() -> _Node:
    root = _Node()
    root.children.append(_Node(root))
    return root


def _deep() -> list:
    deep: list = [np.ones(1)]
    for _ in range(600):
        deep = [deep]
    return deep


#: What each tree is refused with: Python follows a 600-deep list further on some versions (3.13), where the limit of
#: the file's own nesting refuses it.
_REFUSALS = {"cycle": "cannot save leaf 'tree' of .*leads back to itself", "deep": "leads back to itself|nests .* deep"}


@pytest.mark.parametrize(("make", "name"), [(_cyclic, "cycle"), (_deep, "deep")], ids=["cycle", "deep"])
def test_a_tree_that_leads_back_to_itself_or_nests_too_deep_is_refused_and_nothing_written(tmp_path, make, name):
    with pytest.raises((ArgumentError, FormatError), match=_REFUSALS[name]):
        jaxstow.save(tmp_path / "cyclic.jxs", {"tree": make(), "w": np.ones(2)})
    assert not (tmp_path / "cyclic.jxs").exists()
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        with pytest.raises(jaxstow.errors.JaxstowError, match=_REFUSALS[name].split(" of ")[-1]):
            manager.save(1, {"tree": make()})
            manager.wait()
        assert manager.steps() == []


@pytest.mark.parametrize(
    "transform",
    [jax.jit, jax.vmap, jax.grad],
    ids=["jit", "vmap", "grad"],
)
def test_a_save_inside_a_traced_function_is_refused_naming_the_leaf(tmp_path, transform):
    def step(x):
        jaxstow.save(tmp_path / "inside.jxs", {"layers": [{"w": x}]})
        return x.sum()

    with pytest.raises(ArgumentError, match=r"cannot save leaf 'layers/0/w' of .*inside\.jxs: it is a value traced"):
        transform(step)(jnp.ones(3))
    assert not (tmp_path / "inside.jxs").exists()
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        with pytest.raises(ArgumentError, match="save the function's results outside it"):
            jax.jit(lambda x: manager.save(1, {"w": x}) or x)(jnp.ones(3))
        assert manager.steps() == []


def test_a_dict_nested_past_what_jax_follows_is_refused_and_the_interpreter_goes_on(tmp_path):
    # Two keys at each level: jax sorts them, and a recursion error in its sort left Python's recursion count broken.
    tree: dict = {"x": np.ones(1)}
    for level in range(3000):
        tree = {str(level): tree, "x": np.ones(1)}
    with pytest.raises(ArgumentError, match="nests deeper than Python follows"):
        jaxstow.save(tmp_path / "deep.jxs", tree)
    nested: list = [1]
    for _ in range(200):
        nested = [nested]
    jaxstow.save(tmp_path / "after.jxs", {"w": np.ones(2)}, metadata={"nested": nested})  # recursion works still
    assert jaxstow.load_metadata(tmp_path / "after.jxs")["nested"] == nested


_Renamed = collections.namedtuple("_Elsewhere", "a")  # its module holds it under another name than its own


def test_a_namedtuple_its_module_holds_under_another_name_is_refused_at_save_not_at_load():
    with pytest.raises(UnsaveableObjectError, match="_Elsewhere"):
        jaxstow.save(io.BytesIO(), {"p": _Renamed(np.ones(2))})
    jaxstow.saveable(_Renamed, name="tests.renamed_point")  # registered: saved, and loaded by that name
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"p": _Renamed(np.ones(2))})
    buffer.seek(0)
    assert isinstance(jaxstow.load(buffer)["p"], _Renamed)
