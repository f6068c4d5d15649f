"""The file's saved structure against the tree it is restored as: classes, static data and leaf names checked.

A ``like`` of another class or other static data is refused, so is a class whose fields changed since the save (its
values would land in other fields); leaves that nodes name by position in an order of the process's own (FlareJax
orders attributes by hash) are found by the node's names. Partial, abstract and container ``like`` trees still fit.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import subprocess
import sys
import textwrap
import uuid

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._write.encoded import encode_tree
from jaxstow.errors import FormatError, StructureMismatchError


def _name() -> str:
    return f"tests.structure.{uuid.uuid4().hex[:8]}"


def _saved(tree) -> io.BytesIO:
    buffer = io.BytesIO()
    jaxstow.save(buffer, tree)
    buffer.seek(0)
    return buffer


# ``like`` holds another class, or the same class with other static data.


def test_a_like_of_another_class_is_refused_naming_both():
    flr = pytest.importorskip("flarejax")

    class Encoder(flr.Module):
        def __init__(self):
            self.w_in = jnp.full((2,), 1.0)
            self.w_out = jnp.full((2,), 2.0)

    class Decoder(flr.Module):
        def __init__(self):
            self.q = jnp.zeros(2)
            self.r = jnp.zeros(2)

    jaxstow.saveable(Encoder, name=_name())
    jaxstow.saveable(Decoder, name=_name())
    with pytest.raises(StructureMismatchError, match=r"the file has class Encoder .*, like has class Decoder"):
        jaxstow.load(_saved(Encoder()), like=Decoder())


def test_a_node_registered_with_its_fields_in_another_order_is_refused():
    class Bag:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    jax.tree_util.register_pytree_node(
        Bag,
        lambda bag: (list(bag.__dict__.values()), list(bag.__dict__)),
        lambda keys, values: Bag(**dict(zip(keys, values, strict=True))),
    )
    jaxstow.saveable(Bag, name=_name())
    buffer = _saved(Bag(weight=jnp.full(2, 1.0), bias=jnp.full(2, 2.0)))
    with pytest.raises(StructureMismatchError, match=r"\['weight', 'bias'\].*\['bias', 'weight'\]"):
        jaxstow.load(buffer, like=Bag(bias=jnp.zeros(2), weight=jnp.zeros(2)))
    buffer.seek(0)
    same = jaxstow.load(buffer, like=Bag(weight=jnp.zeros(2), bias=jnp.zeros(2)))
    assert same.weight.tolist() == [1.0, 1.0] and same.bias.tolist() == [2.0, 2.0]


class Dense(eqx.Module):
    w: jax.Array
    torch_layout: bool = eqx.field(static=True)


def test_a_static_field_that_differs_from_the_file_is_refused_naming_it():
    buffer = _saved(Dense(jnp.arange(4.0).reshape(2, 2), torch_layout=False))
    like = eqx.filter_eval_shape(lambda: Dense(jnp.zeros((2, 2)), torch_layout=True))
    with pytest.raises(StructureMismatchError, match="torch_layout=False, like's has torch_layout=True") as caught:
        jaxstow.load(buffer, like=like)
    assert "<BytesIO>" in str(caught.value)
    buffer.seek(0)
    restored = jaxstow.load(buffer, like=eqx.filter_eval_shape(lambda: Dense(jnp.zeros((2, 2)), torch_layout=False)))
    assert restored.torch_layout is False and restored.w.tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_static_mismatches_are_listed_with_the_leaves_that_do_not_fit():
    buffer = _saved({"model": Dense(jnp.zeros((2, 2)), torch_layout=False), "step": jnp.int32(1)})
    with pytest.raises(StructureMismatchError) as caught:
        jaxstow.load(buffer, like={"model": Dense(jnp.zeros((3, 2)), torch_layout=True), "step": jnp.int32(0)})
    problems = caught.value.problems
    assert any("'model'" in problem and "torch_layout" in problem for problem in problems)
    assert any(problem.startswith("'model/w'") for problem in problems)


# What still fits: partial, abstract, numpy and torch-free like trees, None leaves, a container into a module.


def test_partial_abstract_and_numpy_likes_of_the_saved_class_still_fit():
    model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
    buffer = _saved({"model": model, "opt": {"mu": jnp.ones(3), "nu": jnp.zeros(3)}, "step": 4})
    abstract = {"model": eqx.filter_eval_shape(lambda: eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(1)))}
    restored = jaxstow.load(buffer, like=abstract, partial=True)
    assert jnp.array_equal(restored["model"].layers[0].weight, model.layers[0].weight)
    buffer.seek(0)
    as_numpy = jax.tree.map(lambda leaf: np.asarray(leaf) if isinstance(leaf, jax.Array) else leaf, {"model": model})
    restored = jaxstow.load(buffer, like={**as_numpy, "opt": {"mu": np.zeros(3, np.float32)}}, partial=True)
    assert isinstance(restored["model"].layers[1].bias, np.ndarray) and restored["opt"]["mu"].tolist() == [1.0] * 3
    buffer.seek(0)
    without_bias = eqx.tree_at(lambda m: m.layers[0].bias, model, None, is_leaf=lambda x: x is None)
    restored = jaxstow.load(buffer, like={"model": without_bias}, partial=True)
    assert restored["model"].layers[0].bias is None


def test_a_state_dict_restores_into_a_module_of_those_names():
    buffer = _saved({"w": jnp.arange(4.0).reshape(2, 2)})
    restored = jaxstow.load(buffer, like=Dense(jnp.zeros((2, 2)), torch_layout=True))
    assert restored.w.tolist() == [[0.0, 1.0], [2.0, 3.0]] and restored.torch_layout is True


def test_a_dict_where_the_file_has_a_list_is_refused():
    model = Dense(jnp.zeros(1), torch_layout=True)
    buffer = _saved({"layers": [jnp.ones(2)], "model": model})
    with pytest.raises(StructureMismatchError, match="'layers': the file has a list, like has a dict"):
        jaxstow.load(buffer, like={"layers": {"0": jnp.zeros(2)}, "model": model})


# Leaves a node names by position, in an order of the process's own.


FLAREJAX_PROGRAM = textwrap.dedent(
    """
    import sys, jax.numpy as jnp, jaxstow, flarejax as flr
    class Net(flr.Module):
        def __init__(self, scale=1.0):
            for i, name in enumerate(["alpha", "beta", "gamma", "delta", "eps"]):
                setattr(self, name, jnp.full((3,), scale * (i + 1)))
    jaxstow.saveable(Net, name="tests.structure.Net")
    if sys.argv[1] == "save":
        jaxstow.save(sys.argv[2], Net())
    else:
        restored = jaxstow.load(sys.argv[2], like=Net(0.0))
        print([float(getattr(restored, name)[0]) for name in ["alpha", "beta", "gamma", "delta", "eps"]])
    """
)


def test_a_flarejax_model_restores_into_like_in_a_process_of_another_hash_seed(tmp_path):
    pytest.importorskip("flarejax")
    path = str(tmp_path / "net.jxs")

    def run(mode: str, seed: str) -> str:
        environment = {**os.environ, "PYTHONHASHSEED": seed, "JAX_PLATFORMS": "cpu"}
        command = [sys.executable, "-W", "ignore", "-c", FLAREJAX_PROGRAM, mode, path]
        return subprocess.run(command, env=environment, check=True, capture_output=True, text=True).stdout

    run("save", "1")
    for seed in ("7", "12"):  # two orders of the names other than the saving process's
        assert run("load", seed).strip() == "[1.0, 2.0, 3.0, 4.0, 5.0]"


# Without like=: a class whose fields changed since the save.


def test_an_equinox_class_whose_fields_changed_order_is_refused_rather_than_rebuilt_swapped():
    name = _name()

    class Block(eqx.Module):
        w: jax.Array
        b: jax.Array

    jaxstow.saveable(Block, name=name)
    buffer = _saved({"block": Block(jnp.full(2, 1.0), jnp.full(2, 2.0))})
    assert jaxstow.load(buffer)["block"].b.tolist() == [2.0, 2.0]

    class Block(eqx.Module):  # the next version of the code: b renamed and moved first
        bias: jax.Array
        w: jax.Array

    jaxstow.saveable(Block, name=name)
    for select in (None, ["block/w"]):
        buffer.seek(0)
        with pytest.raises(StructureMismatchError, match=r"'block/w': Block at 'block' names its leaves") as caught:
            jaxstow.load(buffer, select=select)
        assert "['bias', 'w'] now, the file ['w', 'b']" in str(caught.value)


def test_a_registered_dataclass_whose_fields_changed_order_is_refused():
    name = _name()

    @functools.partial(jax.tree_util.register_dataclass, data_fields=["w", "b"], meta_fields=[])
    @dataclasses.dataclass
    class Pair:
        w: jax.Array
        b: jax.Array

    jaxstow.saveable(Pair, name=name)
    buffer = _saved(Pair(jnp.full(2, 1.0), jnp.full(2, 2.0)))

    @functools.partial(jax.tree_util.register_dataclass, data_fields=["b", "w"], meta_fields=[])
    @dataclasses.dataclass
    class Pair:  # the class as the next version defines it
        b: jax.Array
        w: jax.Array

    jaxstow.saveable(Pair, name=name)
    with pytest.raises(StructureMismatchError, match=r"Pair names its leaves \['b', 'w'\] now, the file \['w', 'b'\]"):
        jaxstow.load(buffer)
    buffer.seek(0)
    restored = jaxstow.load(buffer, like=Pair(b=jnp.zeros(2), w=jnp.zeros(2)))  # matched by name
    assert restored.w.tolist() == [1.0, 1.0] and restored.b.tolist() == [2.0, 2.0]


def test_a_class_that_lost_a_field_is_refused_rather_than_given_the_lost_fields_values():
    name = _name()

    class Net(eqx.Module):
        encoder: jax.Array
        decoder: jax.Array

    jaxstow.saveable(Net, name=name)
    buffer = _saved(Net(jnp.full(3, 1.0), jnp.full(3, 2.0)))

    class Net(eqx.Module):  # the next version: no encoder (the file's encoder would fill the decoder)
        decoder: jax.Array

    jaxstow.saveable(Net, name=name)
    with pytest.raises(StructureMismatchError, match=r"Net names its leaves \['decoder'\] now, the file \['encoder'"):
        jaxstow.load(buffer)
    buffer.seek(0)
    restored = jaxstow.load(buffer, like=Net(jnp.zeros(3)), partial=True)  # matched by name, the encoder left
    assert restored.decoder.tolist() == [2.0, 2.0, 2.0]


def test_an_equinox_class_that_gained_a_field_is_refused_naming_it_where_it_sits():
    name = _name()

    class Block(eqx.Module):
        w: jax.Array
        act: object = eqx.field(static=True)

    jaxstow.saveable(Block, name=name)
    buffer = _saved({"net": {"blocks": [Block(jnp.ones(2), jax.nn.relu)]}})

    class Block(eqx.Module):  # the next version: a bias more
        w: jax.Array
        b: jax.Array
        act: object = eqx.field(static=True)

    jaxstow.saveable(Block, name=name)
    # was: "the root of the tree ...: the structure cannot be rebuilt (IndexError: tuple index out of range)"
    with pytest.raises(FormatError, match=r"leaf 'net/blocks/0' of .*Block cannot be rebuilt from the file") as caught:
        jaxstow.load(buffer)
    assert "the class changed since the save (its fields now: w, b, act)" in str(caught.value)


def test_a_registered_dataclass_that_lost_a_data_field_or_gained_a_static_one_is_refused():
    name = _name()

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Layer:
        old: jax.Array
        w: jax.Array
        width: int = dataclasses.field(metadata={"static": True})

    jaxstow.saveable(Layer, name=name)
    buffer = _saved(Layer(jnp.full(2, 1.0), jnp.full(2, 2.0), 64))

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Layer:  # type: ignore[no-redef]  # the next version: no 'old'
        w: jax.Array
        width: int = dataclasses.field(metadata={"static": True})

    jaxstow.saveable(Layer, name=name)
    with pytest.raises(StructureMismatchError, match=r"Layer names its leaves \['w'\] now, the file \['old', 'w'\]"):
        jaxstow.load(buffer)

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Layer:  # type: ignore[no-redef]  # a static field more, which jax would read from past the file's data
        old: jax.Array
        w: jax.Array
        width: int = dataclasses.field(metadata={"static": True})
        depth: int = dataclasses.field(default=2, metadata={"static": True})

    jaxstow.saveable(Layer, name=name)
    buffer.seek(0)
    with pytest.raises(FormatError, match=r"static fields \('width', 'depth'\)"):
        jaxstow.load(buffer)

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Layer:  # type: ignore[no-redef]  # a data field more, with a default: jax read past the children and crashed
        old: jax.Array
        w: jax.Array
        width: int = dataclasses.field(metadata={"static": True})
        scale: jax.Array | None = None

    jaxstow.saveable(Layer, name=name)
    buffer.seek(0)
    with pytest.raises(FormatError, match=r"2 children do not fit .*Layer's 3 data fields \('old', 'w', 'scale'\)"):
        jaxstow.load(buffer)


def test_static_fields_that_changed_order_are_refused_rather_than_given_each_others_values():
    name = _name()

    class Dense(eqx.Module):
        w: jax.Array
        n_in: int = eqx.field(static=True)
        n_out: int = eqx.field(static=True)

    jaxstow.saveable(Dense, name=name)
    swapped_values = _saved(Dense(jnp.ones((5, 3)), n_in=3, n_out=5))
    same_values = _saved(Dense(jnp.ones((3, 3)), n_in=3, n_out=3))

    class Dense(eqx.Module):  # the next version: n_out first
        w: jax.Array
        n_out: int = eqx.field(static=True)
        n_in: int = eqx.field(static=True)

    jaxstow.saveable(Dense, name=name)
    with pytest.raises(
        StructureMismatchError, match=r"static data saved in 'n_in' \(3\) would be rebuilt into 'n_out'"
    ):
        jaxstow.load(swapped_values)
    restored = jaxstow.load(same_values)  # either order gives each field its value
    assert (restored.n_in, restored.n_out) == (3, 3)


def test_one_object_in_two_static_fields_loads_as_saved_with_and_without_like(tmp_path):
    # Conv2d's stride and dilation are one tuple object, (1, 1): its saved names once pointed both at one field.
    conv = eqx.nn.Conv2d(3, 4, 3, padding="SAME", key=jax.random.key(0))
    assert conv.stride is conv.dilation
    for restored in (jaxstow.load(_saved(conv)), jaxstow.load(_saved(conv), like=conv)):
        assert (restored.stride, restored.dilation, restored.padding) == (conv.stride, conv.dilation, conv.padding)
        np.testing.assert_array_equal(restored.weight, conv.weight)
    # A file saved so (each item named after the first field holding it) loads: the values it swaps are equal.
    frozen = encode_tree(conv)
    frozen.manifest["structure"]["aux_names"] = [
        "dilation" if name == "stride" else name for name in frozen.manifest["structure"]["aux_names"]
    ]
    frozen.write(tmp_path / "named-alike.jxs")
    assert jaxstow.load(tmp_path / "named-alike.jxs").stride == (1, 1)


@pytest.mark.parametrize(
    ("saved", "like"),
    [(1, True), (3, 3.0), (0.0, -0.0), (np.int64(3), 3), (np.float64(0.5), 0.5), ((1, 2), [1, 2])],
    ids=["int-bool", "int-float", "zero-sign", "numpy-int", "numpy-float", "tuple-list"],
)
def test_static_data_equal_by_eq_but_of_another_class_or_sign_is_refused(saved, like):
    # jax's == takes 1 for True: the like's value would have come back in place of the file's.
    class Hyper(eqx.Module):
        w: jax.Array
        h: object = eqx.field(static=True)

    jaxstow.saveable(Hyper, name=_name())
    buffer = _saved(Hyper(jnp.ones(2), saved))
    with pytest.raises(StructureMismatchError, match=r"static data, not restored from like's leaves"):
        jaxstow.load(buffer, like=Hyper(jnp.zeros(2), like))
    buffer.seek(0)
    restored = jaxstow.load(buffer, like=Hyper(jnp.zeros(2), saved))
    assert type(restored.h) is type(saved) and repr(restored.h) == repr(saved)


def test_a_registered_dataclass_whose_static_fields_changed_order_is_refused():
    name = _name()

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Config:
        w: jax.Array
        width: int = dataclasses.field(metadata={"static": True})
        depth: int = dataclasses.field(metadata={"static": True})

    jaxstow.saveable(Config, name=name)
    buffer = _saved(Config(jnp.ones(2), width=64, depth=3))
    assert jaxstow.load(buffer).width == 64

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Config:  # type: ignore[no-redef]  # the next version: depth first
        w: jax.Array
        depth: int = dataclasses.field(metadata={"static": True})
        width: int = dataclasses.field(metadata={"static": True})

    jaxstow.saveable(Config, name=name)
    buffer.seek(0)
    with pytest.raises(StructureMismatchError, match=r"saved in 'width' \(64\) would be rebuilt into 'depth'"):
        jaxstow.load(buffer)


def test_a_file_without_the_names_of_its_static_data_still_loads(tmp_path):
    """Files written before the names were recorded: their static data is rebuilt by position, as it was."""

    class Dense(eqx.Module):
        w: jax.Array
        n_in: int = eqx.field(static=True)

    jaxstow.saveable(Dense, name=_name())
    frozen = encode_tree(Dense(jnp.ones(2), n_in=7))
    assert "n_in" in frozen.manifest["structure"].pop("aux_names")
    frozen.write(tmp_path / "older.jxs")
    assert jaxstow.load(tmp_path / "older.jxs").n_in == 7


@functools.partial(jax.tree_util.register_dataclass, data_fields=["w"], meta_fields=[])
@dataclasses.dataclass
class _Checked:
    w: jax.Array

    def __post_init__(self) -> None:
        if self.w.ndim != 2:  # checks its arrays, which jax's pytree classes must not
            raise ValueError("w must be 2-d")


jaxstow.saveable(_Checked, name="tests.structure_checks.Checked")


def test_a_class_that_checks_its_leaves_when_built_is_told_what_jax_asks_of_it(tmp_path):
    path = tmp_path / "checked.jxs"
    jaxstow.save(path, _Checked(jnp.ones((2, 2))))
    with pytest.raises(
        jaxstow.errors.FormatError,
        match=r"_Checked cannot be rebuilt .*has no attribute 'ndim'\): .*refused stand-in leaves, as one whose __init__ or __post_init__ checks its arrays does",
    ):
        jaxstow.load(path)


def test_a_class_that_refuses_the_restored_arrays_is_a_format_error_naming_the_file():
    # Its own ValueError came out of load, naming no file: the stand-in leaves of the first check passed its check.
    name = _name()

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Layer:
        w: jax.Array

    jaxstow.saveable(Layer, name=name)
    buffer = _saved(Layer(jnp.ones(3)))

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Layer:  # type: ignore[no-redef]  # the next version checks its arrays, which the file's do not pass
        w: jax.Array

        def __post_init__(self) -> None:
            if isinstance(self.w, jax.Array) and self.w.shape[-1] != 4:
                raise ValueError(f"w must end in 4, got {self.w.shape}")

    jaxstow.saveable(Layer, name=name)
    with pytest.raises(FormatError, match=r"refused the restored values \(ValueError: w must end in 4") as caught:
        jaxstow.load(buffer)
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_class_that_gained_a_field_since_the_save_restores_into_like_by_path():
    name = f"tests.gained_{uuid.uuid4().hex}"

    def model(*fields: str) -> type:
        cls = dataclasses.make_dataclass("Model", fields)
        jax.tree_util.register_dataclass(cls, data_fields=list(fields), meta_fields=[])
        return jaxstow.saveable(cls, name=name)

    old = model("a", "b")
    buffer = io.BytesIO()
    jaxstow.save(buffer, old(np.ones(2, np.float32), np.zeros(2, np.float32)))
    with pytest.warns(UserWarning, match="now names"):
        new = model("a", "b", "c")  # the class as the code defines it now
    like = new(*(np.zeros(2, np.float32) for _ in range(3)))
    with pytest.raises(StructureMismatchError, match=r"'c': missing from the file \(expected float32\[2\]\)"):
        jaxstow.load(io.BytesIO(buffer.getvalue()), like=like)
    with pytest.raises(FormatError, match="2 children do not fit"):  # without like, the file's own structure
        jaxstow.load(io.BytesIO(buffer.getvalue()))


@pytest.mark.parametrize("as_numpy", [False, True])
def test_python_scalars_restore_into_the_abstract_tree_jax_eval_shape_makes_of_them(tmp_path, as_numpy):
    def init():
        return {"w": jnp.zeros(3), "step": 0, "lr": 0.1, "done": False}

    path = tmp_path / "state.jxs"
    jaxstow.save(path, {"w": jnp.arange(3.0), "step": 7, "lr": 0.05, "done": True})
    restored = jaxstow.load(path, like=jax.eval_shape(init), as_numpy=as_numpy)
    assert {name: restored[name].item() for name in ("step", "done")} == {"step": 7, "done": True}
    assert restored["lr"] == np.float32(0.05)
    if not as_numpy:
        assert restored["step"].weak_type and restored["lr"].weak_type  # as jax made them of the Python scalars
        assert jax.jit(lambda state: state["step"] + 1)(restored).dtype == jnp.int32

    jaxstow.save(path, {"w": jnp.arange(3.0), "step": 2**40, "lr": 0.05, "done": True})
    with pytest.raises(StructureMismatchError, match=r"'step': the file has int 1099511627776, expected int32\[\]"):
        jaxstow.load(path, like=jax.eval_shape(init))  # an int beyond int32 with x64 off: refused, never wrapped
    strong = {"w": jnp.zeros(3), "step": jnp.int32(0), "lr": jnp.float32(0), "done": False}
    with pytest.raises(StructureMismatchError, match=r"'lr': the file has float 0\.05, expected float32\[\]"):
        jaxstow.load(path, like=jax.eval_shape(lambda: strong))  # a strongly typed target: another request


def test_a_python_number_against_an_array_of_like_and_the_other_way_round_say_what_like_should_hold(tmp_path):
    path = tmp_path / "state.jxs"
    jaxstow.save(path, {"step": 7, "loss": np.float32(0.5)})
    # was: only "'step': the file has int 7, expected int32[]", with nothing to do about it
    with pytest.raises(StructureMismatchError) as caught:
        jaxstow.load(path, like={"step": jax.ShapeDtypeStruct((), jnp.int32), "loss": 0.0})
    assert (
        "'step': the file has int 7, expected int32[]: the file holds a Python int there; give like an int in its "
        "place, or jax.ShapeDtypeStruct((), jnp.int32, weak_type=True) as jax.eval_shape makes"
    ) in str(caught.value)
    assert (
        "'loss': the file has float32[], expected float 0.0: the file holds an array there; give like an array or "
        "jax.ShapeDtypeStruct((), jnp.float32) in its place"
    ) in str(caught.value)
    weak = {"step": jax.ShapeDtypeStruct((), jnp.int32, weak_type=True), "loss": np.float32(0)}
    assert jaxstow.load(path, like=weak)["step"] == 7  # as the message says
