"""Graph objects named by attribute: errors and listings say ``opt/tx`` and ``opt/model/kernel``, never the places
that a node's structure keeps them at (``opt/2/2``), and the error for an optax transformation says both ways out."""

from __future__ import annotations

import json
import sys
import textwrap

import equinox as eqx
import forked
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import jaxstow
from jaxstow.cli import main
from jaxstow.errors import UnsaveableObjectError


class Block(nnx.Module):
    def __init__(self) -> None:
        self.linear = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        self.act = lambda x: x


class Net(nnx.Module):
    def __init__(self) -> None:
        self.block = Block()


class Scaled(eqx.Module):
    weight: jax.Array
    scale: object = eqx.field(static=True)


REGISTERED = jaxstow.saveable(optax.adam(1e-3), name="my_project.attribute_paths.adam")


def _optimizer(tx=None, *, with_model: bool = False):
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    kind = nnx.ModelAndOptimizer if with_model else nnx.Optimizer
    return kind(model, tx or optax.adam(1e-3), wrt=nnx.Param)


def test_an_unregistered_optax_transformation_is_named_by_attribute_with_both_ways_out(tmp_path):
    optimizer = _optimizer()
    with pytest.raises(UnsaveableObjectError) as caught:
        jaxstow.save(tmp_path / "opt.jxs", {"opt": optimizer})
    message = str(caught.value)
    assert caught.value.path == "opt/tx" and message.startswith("cannot save leaf 'opt/tx' of ")
    assert "jaxstow.saveable(optax.adam(1e-3)" in message  # way out 1: register it
    assert "jaxstow.load(path, like=nnx.state(optimizer))" in message  # way out 2: a live optimizer as like
    jaxstow.save(tmp_path / "state.jxs", nnx.state(optimizer))  # the second way, as the message says
    fresh = _optimizer()
    fresh.step[...] = 5
    nnx.update(fresh, jaxstow.load(tmp_path / "state.jxs", like=nnx.state(fresh)))
    assert int(fresh.step[...]) == 0


def test_graph_definitions_and_nested_modules_are_named_by_attribute(tmp_path):
    with pytest.raises(UnsaveableObjectError, match=r"cannot save leaf '0/tx' of .*an optax transformation"):
        jaxstow.save(tmp_path / "split.jxs", nnx.split(_optimizer()))

    with pytest.raises(UnsaveableObjectError, match=r"cannot save leaf 'net/block/act' of "):
        jaxstow.save(tmp_path / "net.jxs", {"net": Net()})

    models = [Scaled(jnp.ones(2), 2.0), Scaled(jnp.ones(2), lambda x: 2 * x)]
    with pytest.raises(UnsaveableObjectError, match=r"cannot save leaf 'layers/1/scale' of "):
        jaxstow.save(tmp_path / "eqx.jxs", {"layers": models})


LOAD_WITHOUT_REGISTERING = """
import json, sys, optax, jaxstow
from flax import nnx
path, kind = sys.argv[1], sys.argv[2]
try:
    jaxstow.load(path)
except jaxstow.errors.UnknownNameError as error:
    print(json.dumps({"path": error.path, "message": str(error)}))
model = nnx.Linear(2, 3, rngs=nnx.Rngs(7))
live = getattr(nnx, kind)(model, optax.adam(1e-3), wrt=nnx.Param)
restored = jaxstow.load(path, like={"opt": live} if kind == "ModelAndOptimizer" else nnx.split(live))
print(json.dumps({"restored": type(restored).__name__}))
"""


@pytest.mark.parametrize(("kind", "path"), [("ModelAndOptimizer", "opt/tx"), ("Optimizer", "0/tx")])
def test_load_errors_name_the_attribute_and_like_restores_without_registering(tmp_path, kind, path):
    optimizer = _optimizer(REGISTERED, with_model=kind == "ModelAndOptimizer")
    tree = {"opt": optimizer} if kind == "ModelAndOptimizer" else nnx.split(optimizer)
    jaxstow.save(tmp_path / "opt.jxs", tree)
    script = textwrap.dedent(LOAD_WITHOUT_REGISTERING)
    done = forked.run(
        [sys.executable, "-c", script, str(tmp_path / "opt.jxs"), kind], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    error, restored = map(json.loads, done.stdout.strip().splitlines())
    assert error["path"] == path and f"leaf '{path}' of " in error["message"]
    assert "register it with jaxstow.saveable(obj, name='my_project.attribute_paths.adam')" in error["message"]
    assert "or restore into a live" in error["message"] and "like=" in error["message"]
    assert restored["restored"] in ("dict", "tuple")


def test_listings_name_attributes(tmp_path, capsys):
    jaxstow.save(
        tmp_path / "opt.jxs",
        {"opt": _optimizer(jaxstow.saveable(optax.sgd(0.1), name="my_project.sgd"), with_model=True)},
    )
    assert main(["inspect", str(tmp_path / "opt.jxs")]) == 0
    out = capsys.readouterr().out
    assert "opt/model/kernel/value" in out and "opt/step/value" in out
    with jaxstow.open(tmp_path / "opt.jxs") as reader:
        assert all(not part.isdigit() or part == "0" for path in reader.paths for part in path.split("/"))
