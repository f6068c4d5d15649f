"""flax nnx objects saved whole and loaded without a template: a Module, an Optimizer, an nnx.split GraphDef."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxstow
from jaxstow.errors import UnsaveableObjectError


class Classifier(nnx.Module):
    def __init__(self, features: int, *, rngs: nnx.Rngs) -> None:
        self.features = features
        self.encoder = nnx.Linear(3, features, rngs=rngs)
        self.norm = nnx.BatchNorm(features, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.heads = nnx.List([nnx.Linear(features, 1, rngs=rngs), nnx.Linear(features, 2, use_bias=False, rngs=rngs)])

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = self.dropout(self.norm(jax.nn.relu(self.encoder(x))))
        return jnp.concatenate([head(hidden) for head in self.heads], axis=-1)


X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)


def _round_trip(tree, path):
    jaxstow.save(path, tree)
    return jaxstow.load(path)


def test_a_whole_module_without_a_template(tmp_path):
    model = Classifier(8, rngs=nnx.Rngs(0))
    model(X)  # batch statistics move away from their initial values
    restored = _round_trip(model, tmp_path / "model.jxs")
    assert type(restored) is Classifier and restored.features == 8
    assert restored.heads[1].use_bias is False and restored.dropout.rate == 0.2
    np.testing.assert_array_equal(restored.norm.mean[...], model.norm.mean[...])
    model.eval()
    restored.eval()
    np.testing.assert_array_equal(restored(X), model(X))
    restored.train()
    assert restored(X).shape == (4, 3)  # the dropout's random stream came back too


def _loss(model: Classifier) -> jax.Array:
    return jnp.mean(model(X) ** 2)


def test_an_optimizer_continues_exactly(tmp_path):
    model = Classifier(4, rngs=nnx.Rngs(1))
    model.eval()
    tx = jaxstow.saveable(optax.adam(1e-2), name="tests.nnx.adam")  # closures are saved by name
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    optimizer.update(model, nnx.grad(_loss)(model))
    restored_model, restored = _round_trip((model, optimizer), tmp_path / "run.jxs")
    assert type(restored) is nnx.Optimizer and int(restored.step[...]) == 1 and restored.tx is tx
    for current, optimizer_ in ((model, optimizer), (restored_model, restored)):
        optimizer_.update(current, nnx.grad(_loss)(current))
    np.testing.assert_array_equal(restored_model.encoder.kernel[...], model.encoder.kernel[...])
    np.testing.assert_array_equal(restored_model(X), model(X))


def test_an_optimizer_names_its_unregistered_transformation(tmp_path):
    model = Classifier(4, rngs=nnx.Rngs(1))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    with pytest.raises(
        UnsaveableObjectError, match=r"leaf 'tx' .*GradientTransformation.*register it where it is made"
    ):
        jaxstow.save(tmp_path / "opt.jxs", optimizer)


def test_an_nnx_split_graphdef_and_state(tmp_path):
    model = Classifier(8, rngs=nnx.Rngs(2))
    model.eval()
    graphdef, state = nnx.split(model)
    restored_graphdef, restored_state = _round_trip((graphdef, state), tmp_path / "split.jxs")
    assert restored_graphdef == graphdef
    np.testing.assert_array_equal(nnx.merge(restored_graphdef, restored_state)(X), model(X))
    alone = _round_trip(graphdef, tmp_path / "graphdef.jxs")
    assert alone == graphdef and hash(alone) == hash(graphdef)


MODULE = """
from flax import nnx

class Tiny(nnx.Module):
    def __init__(self, rngs):
        self.layer = nnx.Linear(2, 2, rngs=rngs)
"""


def test_a_module_from_an_installed_package_in_a_fresh_process(tmp_path):
    (tmp_path / "tinymodels.py").write_text(MODULE)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))

    def run(code: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "tiny.jxs")]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": path}
        )

    saved = run(
        """
        import sys, jaxstow, tinymodels
        from flax import nnx
        jaxstow.save(sys.argv[1], tinymodels.Tiny(nnx.Rngs(0)))
        """
    )
    assert saved.returncode == 0, saved.stderr
    # The module not imported: refused naming it; imported then, in the same process: loaded.
    loaded = run(
        """
        import sys, jaxstow
        from flax import nnx
        try:
            jaxstow.load(sys.argv[1])
        except jaxstow.errors.JaxstowError as error:
            print(error, file=sys.stderr)
        import tinymodels
        print(type(jaxstow.load(sys.argv[1])).__name__)
        """
    )
    assert "'tinymodels.Tiny'" in loaded.stderr
    assert "tinymodels, which is installed but not imported in this process: import tinymodels first" in loaded.stderr
    assert loaded.stdout.strip() == "Tiny", loaded.stderr


def test_a_file_can_rebuild_only_flax_graph_records():
    from jaxstow._format.skeleton import decode_value
    from jaxstow.errors import FormatError, RefusedNameError

    with pytest.raises(FormatError, match=r"'os\.system' is not an object jaxstow rebuilds from its fields"):
        decode_value({"object": "os.system", "fields": [["command", "echo never run"]]}, file="evil.jxs")
    fields = [["type", {"nodetype": "subprocess.Popen"}], ["index", 0], ["outer_index", None]]
    with pytest.raises(RefusedNameError, match=r"'subprocess\.Popen', which jaxstow's name policy refuses"):
        decode_value({"object": "flax.nnx.graphlib.NodeDef", "fields": fields}, file="evil.jxs")
    fields[0][1] = {"nodetype": "jax.tree_util.Partial"}  # a class a file may name, but not a flax node type
    with pytest.raises(FormatError, match=r"'jax\.tree_util\.Partial' is not a flax nnx node or variable type"):
        decode_value({"object": "flax.nnx.graphlib.NodeDef", "fields": fields}, file="evil.jxs")
    with pytest.raises(FormatError, match=r"cannot rebuild flax\.nnx\.graphlib\.NodeRef from its fields"):
        decode_value({"object": "flax.nnx.graphlib.NodeRef", "fields": [["shell", "rm -rf /"]]}, file="evil.jxs")
    with pytest.raises(FormatError, match=r"'index' is named twice"):
        decode_value({"object": "flax.nnx.graphlib.NodeRef", "fields": [["index", 0], ["index", 1]]}, file="evil.jxs")
    with pytest.raises(FormatError, match=r"unreadable fields of flax\.nnx\.graphlib\.NodeRef"):
        decode_value({"object": "flax.nnx.graphlib.NodeRef", "fields": [["index"]]}, file="evil.jxs")


class Tied(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Linear(2, 2, rngs=rngs)
        self.unembed = self.embed  # tied weights


def test_a_module_with_tied_weights_is_refused_saying_to_split_it(tmp_path):
    model = Tied(rngs=nnx.Rngs(0))
    with pytest.raises(jaxstow.errors.ArgumentError, match=r"'unembed/bias' .* Variable at 'embed/bias' .*nnx\.split"):
        jaxstow.save(tmp_path / "tied.jxs", model)
    with jaxstow.CheckpointManager(tmp_path / "run") as manager, pytest.raises(jaxstow.errors.ArgumentError):
        manager.save(1, {"model": model})
    assert not (tmp_path / "tied.jxs").exists()
    graphdef, state = nnx.split(model)
    jaxstow.save(tmp_path / "split.jxs", {"graphdef": graphdef, "state": state})
    loaded = jaxstow.load(tmp_path / "split.jxs")
    restored = nnx.merge(loaded["graphdef"], loaded["state"])
    assert restored.embed is restored.unembed


class _Regularized(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)


def test_a_module_saved_in_eval_mode_and_a_like_in_train_mode_name_the_mode(tmp_path):
    # The message named nnx's own _pytree__state, which differs between any two modules, not use_running_average.
    from jaxstow.errors import StructureMismatchError

    module = _Regularized(nnx.Rngs(0, dropout=1))
    module.eval()
    jaxstow.save(tmp_path / "eval.jxs", module)
    like = _Regularized(nnx.Rngs(0, dropout=1))
    like.eval()
    loaded = jaxstow.load(tmp_path / "eval.jxs", like=like)
    assert loaded.norm.use_running_average and loaded.drop.deterministic
    with pytest.raises(StructureMismatchError) as raised:
        jaxstow.load(tmp_path / "eval.jxs", like=_Regularized(nnx.Rngs(0, dropout=1)))
    assert "BatchNorm has use_running_average=True, like's has use_running_average=False" in str(raised.value)
    assert "Dropout has deterministic=True, like's has deterministic=False" in str(raised.value)
    assert "_pytree__state" not in str(raised.value)
