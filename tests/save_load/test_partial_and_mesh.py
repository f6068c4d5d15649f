"""``functools.partial`` saved like ``jax.tree_util.Partial`` (a named function and data arguments, refused clearly
otherwise), and a mesh's axis types (``Explicit``, ``Auto``, ...) surviving ``sharding="saved"``."""

from __future__ import annotations

import functools
import io
import sys

import equinox as eqx
import forked
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow._write.encoded import encode_tree
from jaxstow.errors import FormatError, RefusedNameError, UnsaveableObjectError


def test_a_partial_activation_saves_and_loads_in_a_fresh_process(tmp_path):
    activation = functools.partial(jax.nn.leaky_relu, negative_slope=0.1)
    model = eqx.nn.MLP(3, 2, 8, 2, activation=activation, key=jax.random.key(0))
    jaxstow.save(tmp_path / "mlp.jxs", model)
    x = jnp.linspace(-1.0, 1.0, 3)
    np.save(tmp_path / "expected.npy", np.asarray(model(x)))
    script = (
        "import sys, equinox, jax, jax.numpy as jnp, numpy as np, jaxstow; "
        "model = jaxstow.load(sys.argv[1] + '/mlp.jxs'); "
        "assert model.activation.func is jax.nn.leaky_relu and model.activation.keywords == {'negative_slope': 0.1}; "
        "np.testing.assert_array_equal(np.asarray(model(jnp.linspace(-1.0, 1.0, 3))), np.load(sys.argv[1] + '/expected.npy')); "
        "print('same')"
    )
    done = forked.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-3000:]


def test_partials_with_positional_and_nested_arguments_round_trip():
    buffer = io.BytesIO()
    tree = {"clip": functools.partial(jnp.clip, min=-1.0, max=(2.0,)), "add": functools.partial(jnp.add, 3)}
    jaxstow.save(buffer, tree)
    buffer.seek(0)
    loaded = jaxstow.load(buffer)
    assert loaded["clip"].func is jnp.clip and loaded["clip"].keywords == {"min": -1.0, "max": (2.0,)}
    assert loaded["add"].func is jnp.add and loaded["add"].args == (3,) and int(loaded["add"](4)) == 7


@pytest.mark.parametrize(
    ("partial", "expected"),
    [
        (
            functools.partial(lambda x, slope: x * slope, slope=2.0),
            r"a functools.partial over <function <lambda>.*register the function with jaxstow.saveable",
        ),
        (
            functools.partial(jnp.multiply, jnp.ones(2)),
            r"a functools.partial with arrays among its arguments.*jax.tree_util.Partial",
        ),
        (functools.partial(jnp.multiply, lambda: 0), r"cannot save leaf 'act/args/0' of .*<lambda>"),
    ],
    ids=["unnamed-function", "array-argument", "unsaveable-argument"],
)
def test_partials_that_cannot_be_saved_are_refused_clearly(partial, expected):
    with pytest.raises(UnsaveableObjectError, match=expected):
        jaxstow.save(io.BytesIO(), {"act": partial})


def _crafted(tree, edit) -> io.BytesIO:
    """``tree`` saved with its manifest changed by ``edit`` before the write (so every checksum holds): a crafted file."""
    encoded = encode_tree(tree)
    edit(encoded.manifest)
    buffer = io.BytesIO()
    encoded.write(buffer)
    buffer.seek(0)
    return buffer


def test_a_file_naming_a_refused_function_in_a_partial_is_refused():
    def to_numpy_save(manifest):
        for leaf in manifest["leaves"]:
            if leaf["path"] == "act":
                leaf["value"]["partial"]["func"] = "numpy.save"

    crafted = _crafted({"act": functools.partial(jnp.add, 1), "w": np.ones(2, np.float32)}, to_numpy_save)
    with pytest.raises(RefusedNameError, match=r"leaf 'act/func' .*'numpy.save'"):
        jaxstow.load(crafted)


def _mesh(types):
    return jax.make_mesh((2, 2), ("data", "model"), axis_types=types)


@pytest.mark.parametrize(
    "types",
    [(AxisType.Explicit, AxisType.Explicit), (AxisType.Auto, AxisType.Auto), (AxisType.Explicit, AxisType.Auto)],
    ids=["explicit", "auto", "mixed"],
)
def test_mesh_axis_types_survive_sharding_saved(tmp_path, types):
    mesh = _mesh(types)
    array = jax.device_put(jnp.arange(32.0).reshape(4, 8), NamedSharding(mesh, P("data", "model")))
    jaxstow.save(tmp_path / "sharded.jxs", {"w": array})
    restored = jaxstow.load(tmp_path / "sharded.jxs", sharding="saved")["w"]
    assert restored.sharding.mesh.axis_types == types
    assert restored.sharding.mesh.axis_names == ("data", "model") and restored.sharding.spec == P("data", "model")
    np.testing.assert_array_equal(np.asarray(restored), np.asarray(array))
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"params": {"w": array}})
        assert manager.restore(sharding="saved")["params"]["w"].sharding.mesh.axis_types == types


def test_files_without_axis_types_mean_auto_and_unknown_types_are_refused(tmp_path):
    array = jax.device_put(jnp.arange(32.0).reshape(4, 8), NamedSharding(_mesh((AxisType.Explicit,) * 2), P("data")))

    def without_types(manifest):
        del manifest["leaves"][0]["sharding"]["axis_types"]

    def bogus_types(manifest):
        manifest["leaves"][0]["sharding"]["axis_types"] = ["Explicit", "Bogus"]

    older = jaxstow.load(_crafted({"w": array}, without_types), sharding="saved")["w"]
    assert older.sharding.mesh.axis_types == (AxisType.Auto, AxisType.Auto)
    with pytest.raises(FormatError, match="sharding"):
        jaxstow.load(_crafted({"w": array}, bogus_types), sharding="saved")
