"""Whole models with their hyperparameters, optimizer states, and loading into an existing structure."""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import subprocess
import sys
import textwrap

import equinox as eqx
import forked
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxstow
from jaxstow.errors import StructureMismatchError, UnknownNameError, UnsaveableObjectError

KEY = jax.random.key(0)


def _roundtrip(tmp_path, tree, name="model.jxs"):
    jaxstow.save(tmp_path / name, tree)
    return jaxstow.load(tmp_path / name)


def _same_leaves(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, jax.Array | np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
        else:
            assert x is y or x == y


def test_default_equinox_mlp_rebuilds_without_a_template(tmp_path):
    mlp = eqx.nn.MLP(4, 2, width_size=8, depth=2, key=KEY)
    restored = _roundtrip(tmp_path, mlp)
    assert type(restored) is eqx.nn.MLP
    assert restored.activation is jax.nn.relu and restored.final_activation is mlp.final_activation
    assert (restored.in_size, restored.width_size, restored.depth) == (4, 8, 2)
    x = jnp.linspace(-1, 1, 4)
    assert jnp.array_equal(restored(x), mlp(x))


_KEYS = jax.random.split(KEY, 8)
#: equinox's layers as a user makes them, each saved and loaded whole, and into a fresh twin (like=).
EQUINOX_LAYERS = {
    "Linear": lambda key: eqx.nn.Linear(3, 4, key=key),
    "Linear scalar": lambda key: eqx.nn.Linear("scalar", 2, use_bias=False, key=key),
    "Conv1d": lambda key: eqx.nn.Conv1d(2, 3, 3, stride=2, key=key),
    "Conv2d": lambda key: eqx.nn.Conv2d(3, 4, 3, padding="SAME", key=key),
    "ConvTranspose2d": lambda key: eqx.nn.ConvTranspose2d(2, 2, 3, key=key),
    "LayerNorm": lambda key: eqx.nn.LayerNorm(5, eps=1e-6),
    "GroupNorm": lambda key: eqx.nn.GroupNorm(2, 4),
    "Embedding": lambda key: eqx.nn.Embedding(10, 4, key=key),
    "GRUCell": lambda key: eqx.nn.GRUCell(3, 4, key=key),
    "LSTMCell": lambda key: eqx.nn.LSTMCell(3, 4, key=key),
    "MultiheadAttention": lambda key: eqx.nn.MultiheadAttention(2, 8, key=key),
    "Dropout": lambda key: eqx.nn.Dropout(0.1),
    "MaxPool2d": lambda key: eqx.nn.MaxPool2d(2, stride=2),
    "PReLU": lambda key: eqx.nn.PReLU(),
    "Sequential": lambda key: eqx.nn.Sequential([eqx.nn.Linear(2, 3, key=key), eqx.nn.Lambda(jax.nn.relu)]),
    "BatchNorm with state": lambda key: eqx.nn.make_with_state(eqx.nn.BatchNorm)(4, "batch"),
}


@pytest.mark.parametrize("make", EQUINOX_LAYERS.values(), ids=EQUINOX_LAYERS.keys())
def test_equinox_layers_load_whole_and_into_a_fresh_twin(tmp_path, make):
    layer = make(_KEYS[0])
    jaxstow.save(tmp_path / "layer.jxs", layer)
    for restored in (jaxstow.load(tmp_path / "layer.jxs"), jaxstow.load(tmp_path / "layer.jxs", like=make(_KEYS[1]))):
        assert jax.tree.structure(restored) == jax.tree.structure(layer)
        _same_leaves(restored, layer)


def test_a_partial_keeps_keywords_that_are_no_identifiers(tmp_path):
    # Any string passes as **kwargs; one that is no identifier was saved, then refused at load as unreadable.
    activation = functools.partial(jax.nn.gelu, approximate=False, **{"scale-factor": 2.0})
    restored = _roundtrip(tmp_path, {"activation": activation})["activation"]
    assert restored.func is jax.nn.gelu and restored.keywords == {"approximate": False, "scale-factor": 2.0}


# The FlareJax scenario: Linear layers, a registered lambda and jax.nn.softmax.
activation = jaxstow.saveable(lambda x: jnp.maximum(0, x), name="tests.flarejax_activation")


def test_flarejax_model_round_trips_with_identical_functions(tmp_path):
    k1, k2 = jax.random.split(KEY)
    model = eqx.nn.Sequential(
        [
            eqx.nn.Linear(784, 32, key=k1),
            eqx.nn.Lambda(activation),
            eqx.nn.Linear(32, 10, key=k2),
            eqx.nn.Lambda(jax.nn.softmax),
        ]
    )
    restored = _roundtrip(tmp_path, model, "model.npz")
    assert restored.layers[1].fn is activation and restored.layers[3].fn is jax.nn.softmax
    x = jnp.ones(784)
    assert jnp.array_equal(restored(x), model(x))


class Hyper(eqx.Module):
    weight: jax.Array
    width: int = eqx.field(static=True)
    rate: float = eqx.field(static=True)
    nan: float = eqx.field(static=True)
    flag: bool = eqx.field(static=True)
    name: str = eqx.field(static=True)
    shift: complex = eqx.field(static=True)
    nothing: None = eqx.field(static=True)
    dtype: np.dtype = eqx.field(static=True)
    scale: np.float32 = eqx.field(static=True)
    shape: tuple[int, ...] = eqx.field(static=True)


@pytest.mark.filterwarnings("ignore:A JAX array is being set as static")
def test_hyperparameters_of_every_scalar_type_keep_their_type(tmp_path):
    model = Hyper(
        jnp.ones(3), 7, 1e-3, float("nan"), True, "gelu", 2j, None, np.dtype("bfloat16"), np.float32(0.5), (2, 3)
    )
    restored = _roundtrip(tmp_path, model)
    for field in dataclasses.fields(Hyper)[1:]:
        got, expected = getattr(restored, field.name), getattr(model, field.name)
        assert type(got) is type(expected), field.name
        assert got == expected or (field.name == "nan" and math.isnan(got)), field.name


def test_optax_states_rebuild_without_a_template(tmp_path):
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    state = optimizer.init(params)
    _, state = optimizer.update(params, state, params)
    restored = _roundtrip(tmp_path, state)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    _same_leaves(restored, state)
    assert type(restored[1][0]).__name__ == "ScaleByAdamState"


def test_flax_nnx_state_round_trips(tmp_path):
    nnx = pytest.importorskip("flax.nnx")

    model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.BatchNorm(4, rngs=nnx.Rngs(1)))
    state = nnx.state(model)
    restored = _roundtrip(tmp_path, state)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    _same_leaves(restored, state)
    graphdef = nnx.graphdef(model)
    x = jnp.ones((2, 3))
    assert jnp.array_equal(nnx.merge(graphdef, restored)(x), model(x))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: dict[str, jax.Array]
    step: jax.Array
    lr: float = dataclasses.field(metadata={"static": True})


def test_registered_dataclasses_round_trip(tmp_path):
    state = TrainState({"w": jnp.ones(2)}, jnp.asarray(3), 0.1)
    restored = _roundtrip(tmp_path, state)
    assert type(restored) is TrainState and restored.lr == 0.1 and int(restored.step) == 3


def test_an_unregistered_lambda_is_refused_with_its_path(tmp_path):
    model = eqx.nn.Sequential([eqx.nn.Linear(2, 2, key=KEY), eqx.nn.Lambda(lambda x: x * 2)])
    with pytest.raises(UnsaveableObjectError, match=r"leaf 'layers/1/fn' of .*model.jxs.*saveable") as caught:
        jaxstow.save(tmp_path / "model.jxs", model)
    assert isinstance(caught.value, TypeError)
    assert not (tmp_path / "model.jxs").exists()


def test_saveable_needs_a_name_for_a_lambda_and_warns_on_renaming():
    with pytest.raises(ValueError, match="explicit name"):
        jaxstow.saveable(lambda x: x)

    def first(x):
        return x

    def second(x):
        return x

    jaxstow.saveable(first, name="tests.renamed")
    with pytest.warns(UserWarning, match="tests.renamed"):
        jaxstow.saveable(second, name="tests.renamed")
    assert jaxstow._names.registry.lookup("tests.renamed") is second


@jaxstow.saveable
def scaled(x):
    return 2 * x


def test_saveable_as_decorator_defaults_to_module_qualname():
    assert jaxstow._names.registry.name_of(scaled) == f"{__name__}.scaled"
    assert jaxstow._names.registry.lookup(f"{__name__}.scaled") is scaled


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return forked.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, check=True)


def test_a_name_unknown_at_load_raises_a_clear_error(tmp_path):
    path = tmp_path / "model.jxs"
    _run(
        """
        import sys, jax.numpy as jnp, jaxstow
        swish = jaxstow.saveable(lambda x: x * jnp.tanh(x), name="elsewhere.swish")
        jaxstow.save(sys.argv[1], {"act": swish, "w": jnp.ones(2)})
        """,
        str(path),
    )
    with pytest.raises(UnknownNameError, match=r"leaf 'act' of .*model.jxs.*'elsewhere.swish'.*not registered"):
        jaxstow.load(path)


def test_loading_never_constructs_an_unregistered_class(tmp_path):
    """A file naming an imported class of a forbidden module (here subprocess.Popen) is refused, not run."""
    from jaxstow._write.encoded import encode_tree

    frozen = encode_tree({"w": jnp.ones(1)})
    frozen.manifest["structure"] = {
        "node": "subprocess.Popen",
        "aux": {"list": ["touch", str(tmp_path / "owned")]},
        "children": ["*"],
    }
    frozen.write(tmp_path / "evil.jxs")
    with pytest.raises(jaxstow.errors.RefusedNameError, match=r"'subprocess.Popen'.*name policy"):
        jaxstow.load(tmp_path / "evil.jxs")
    assert not (tmp_path / "owned").exists()


def test_a_library_that_is_not_imported_is_named_in_the_error(tmp_path):
    path = tmp_path / "state.jxs"
    _run(
        "import sys, optax, jax.numpy as jnp, jaxstow; jaxstow.save(sys.argv[1], optax.sgd(0.1).init(jnp.ones(2)))",
        str(path),
    )
    result = forked.run(
        [sys.executable, "-c", "import sys, jaxstow; jaxstow.load(sys.argv[1])", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "UnknownNameError" in result.stderr and "it belongs to optax" in result.stderr
    assert "import optax first" in result.stderr


# The Objax scenario: save weights, change a bias, load into the structure, the bias is restored.
@pytest.mark.parametrize("target", ["name", "file object"])
def test_objax_weights_load_back_into_the_structure(tmp_path, target):
    net = eqx.nn.Sequential([eqx.nn.Linear(768, 1, key=KEY), eqx.nn.Lambda(jax.nn.sigmoid)])
    net = eqx.tree_at(lambda n: n.layers[0].bias, net, jnp.zeros(1))
    if target == "name":
        jaxstow.save(tmp_path / "net.npz", net)
        source = tmp_path / "net.npz"
    else:
        source = io.BytesIO()
        jaxstow.save(source, net)
        source.seek(0)
    changed = eqx.tree_at(lambda n: n.layers[0].bias, net, net.layers[0].bias + 1)
    assert float(changed.layers[0].bias.sum()) == 1.0
    restored = jaxstow.load(source, like=changed)
    assert float(restored.layers[0].bias.sum()) == 0.0
    assert restored.layers[1].fn is jax.nn.sigmoid


def test_like_mismatches_are_listed_all_at_once(tmp_path):
    jaxstow.save(
        tmp_path / "w.jxs",
        {"w": jnp.ones((2, 3)), "b": jnp.ones(3), "n": 3, "extra": jnp.ones(1), "key": jax.random.key(1)},
    )
    like = {"w": jnp.ones((3, 2)), "b": jnp.ones(3, jnp.int32), "n": 3.0, "missing": jnp.ones(2), "key": jnp.ones(2)}
    with pytest.raises(StructureMismatchError) as caught:
        jaxstow.load(tmp_path / "w.jxs", like=like)
    problems = caught.value.problems
    assert len(problems) == 6, problems
    text = str(caught.value)
    for expected in (
        "'b': the file has float32[3], expected int32[3]",
        "'key': the file has key<threefry2x32>[], expected float32[2]",
        "'missing': missing from the file (expected float32[2])",
        "'n': the file has int 3, expected float 3.0",
        "'w': the file has float32[2, 3], expected float32[3, 2]",
        "'extra': in the file but not in the structure (float32[1])",
    ):
        assert expected in text
    assert "w.jxs" in text


def test_like_keeps_numpy_leaves_numpy_and_places_jax_leaves(tmp_path):
    jaxstow.save(tmp_path / "w.jxs", {"a": jnp.ones(2), "b": jnp.ones(2)})
    restored = jaxstow.load(tmp_path / "w.jxs", like={"a": np.zeros(2, np.float32), "b": jnp.zeros(2)})
    assert type(restored["a"]) is np.ndarray and isinstance(restored["b"], jax.Array)
    assert restored["b"].sharding == jnp.zeros(2).sharding


@pytest.mark.parametrize(
    "name", ["jax._src.pickle_util.loads", "jax._src.clusters.mpi4py_cluster.find_spec", "os.system"]
)
def test_internals_and_foreign_functions_have_no_name(name):
    import jax._src.pickle_util  # noqa: F401  (imported, so only the rule can refuse it)

    with pytest.raises(UnknownNameError):
        jaxstow._names.registry.lookup(name)
