"""flax's ``kernel`` (in, out) exported as torch's ``weight`` (out, in): turned over as ``transposed=`` says, or refused
where a square kernel would fit torch's model as saved.

flax models write the files; the torch modules that load the exported folder must compute what flax computes on the
same input, and the folder must load back into flax as it was.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow import huggingface
from jaxstow.errors import ArgumentError

torch = pytest.importorskip("torch")
load_torch = pytest.importorskip("safetensors.torch").load_file

WIDTH = 8
INPUTS = np.random.default_rng(0).standard_normal((3, WIDTH)).astype(np.float32)


class FlaxMLP(nn.Module):
    """torch's ``Sequential(Linear, ReLU, Linear)`` in flax.linen, named as ``nn.Sequential`` names its layers."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(WIDTH, name="layers_2")(nn.relu(nn.Dense(WIDTH, name="layers_0")(x)))


def torch_names(path: str) -> str:
    """``params/layers_0/kernel`` as torch's ``0.weight``."""
    return path.removeprefix("params/").removeprefix("layers_").replace("/", ".").replace("kernel", "weight")


@pytest.fixture
def saved(tmp_path):
    params = FlaxMLP().init(jax.random.key(0), jnp.asarray(INPUTS))
    jaxstow.save(tmp_path / "flax.jxs", params)
    return tmp_path / "flax.jxs", params


def torch_outputs(folder) -> np.ndarray:
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
    model.load_state_dict(load_torch(folder / "model-00001-of-00001.safetensors"))  # strict: every name, every shape
    with torch.no_grad():
        return model(torch.from_numpy(INPUTS)).numpy()


def test_square_kernels_exported_as_torch_weights_are_refused_without_transposed(saved, tmp_path):
    source, _ = saved
    with pytest.raises(ArgumentError) as refused:  # was exported as saved: torch computed another function
        huggingface.export_safetensors(source, tmp_path / "hf", names=torch_names)
    message = str(refused.value)
    assert "names= exports 'kernel' leaves as 'weight' tensors, across two layouts" in message, message
    assert "transposed={'params/layers_0/kernel', 'params/layers_2/kernel'}" in message, message
    assert message.endswith("(leaf 'params/layers_0/kernel': [8, 8])"), message
    assert not (tmp_path / "hf").exists()


def test_kernels_marked_transposed_give_torch_the_outputs_of_flax(saved, tmp_path):
    source, params = saved
    marked = {"params/layers_0/kernel", "params/layers_2/kernel"}
    for folder, transposed in (("set", marked), ("predicate", lambda path: path.endswith("kernel"))):
        huggingface.export_safetensors(source, tmp_path / folder, names=torch_names, transposed=transposed)
        expected = np.asarray(FlaxMLP().apply(params, jnp.asarray(INPUTS)))
        np.testing.assert_allclose(torch_outputs(tmp_path / folder), expected, rtol=1e-5, atol=1e-5)
    back = huggingface.load(
        tmp_path / "set",
        like=params,
        names=lambda name: f"params/layers_{name.replace('.', '/').replace('weight', 'kernel')}",
        transposed=lambda name: name.endswith("weight"),
        as_numpy=True,
    )
    for layer in ("layers_0", "layers_2"):
        np.testing.assert_array_equal(back["params"][layer]["kernel"], params["params"][layer]["kernel"])


def test_transposed_empty_tuple_writes_every_leaf_as_saved(saved, tmp_path):
    source, params = saved
    huggingface.export_safetensors(source, tmp_path / "hf", names=torch_names, transposed=())
    written = load_torch(tmp_path / "hf" / "model-00001-of-00001.safetensors")
    np.testing.assert_array_equal(written["0.weight"].numpy(), params["params"]["layers_0"]["kernel"])


def test_a_kind_turned_in_part_or_a_conv_kernel_marked_is_refused(tmp_path):
    kernels = {"a": {"kernel": np.eye(4, dtype=np.float32)}, "b": {"kernel": np.ones((4, 4), np.float32)}}
    jaxstow.save(tmp_path / "dense.jxs", kernels)
    with pytest.raises(ArgumentError, match=r"transposed= turns 'a/kernel' over but not 'b/kernel' of the same kind"):
        huggingface.export_safetensors(tmp_path / "dense.jxs", tmp_path / "hf", transposed={"a/kernel"})
    jaxstow.save(tmp_path / "conv.jxs", {"conv": {"kernel": np.zeros((3, 3, 3, 3), np.float32)}})
    rename = {"conv/kernel": "conv.weight"}
    with pytest.raises(ArgumentError, match=r"no shape tells how 'conv/kernel' should be written"):
        huggingface.export_safetensors(tmp_path / "conv.jxs", tmp_path / "hf", names=rename)
    with pytest.raises(ArgumentError, match=r"transposed= marks 'conv/kernel', of shape \[3, 3, 3, 3\]: only 2-d"):
        huggingface.export_safetensors(tmp_path / "conv.jxs", tmp_path / "hf", names=rename, transposed={"conv/kernel"})
    with pytest.raises(ArgumentError, match=r"transposed= names leaves it lacks: \['conv/weight'\]"):
        huggingface.export_safetensors(tmp_path / "conv.jxs", tmp_path / "hf", transposed={"conv/weight"})
    assert not (tmp_path / "hf").exists()


def test_a_square_kernel_turned_while_another_of_its_kind_is_not_is_refused_as_a_load_refuses_it(tmp_path):
    rng = np.random.default_rng(0)
    kernels = {"sq": {"kernel": rng.standard_normal((8, 8))}, "up": {"kernel": rng.standard_normal((8, 12))}}
    jaxstow.save(tmp_path / "dense.jxs", jax.tree.map(lambda a: a.astype(np.float32), kernels))
    names = {"sq/kernel": "sq.weight", "up/kernel": "up.weight"}
    # was: written, 'up.weight' left (in, out) under torch's name; a load with the same marking refused the folder
    with pytest.raises(ArgumentError, match=r"turns the square 'sq/kernel' over but not 'up/kernel' of the same kind"):
        huggingface.export_safetensors(tmp_path / "dense.jxs", tmp_path / "hf", names=names, transposed={"sq/kernel"})
    assert not (tmp_path / "hf").exists()
    both = {"sq/kernel", "up/kernel"}
    huggingface.export_safetensors(tmp_path / "dense.jxs", tmp_path / "hf", names=names, transposed=both)
    like = jax.tree.map(lambda a: np.zeros(a.shape, np.float32), kernels)
    back = huggingface.load(
        tmp_path / "hf", like=like, names={v: k for k, v in names.items()}, transposed=set(names.values())
    )
    np.testing.assert_array_equal(back["up"]["kernel"], kernels["up"]["kernel"].astype(np.float32))
