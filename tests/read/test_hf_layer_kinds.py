"""A torch model's Hugging Face folder loaded into a flax model whose square and oblong kernels turn over alike."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from jaxstow import huggingface
from jaxstow.errors import ArgumentError, StructureMismatchError

WIDTH, HIDDEN, VOCAB = 8, 32, 50
#: What the refusal of a transposed= that leaves out the square kernels says to add.
ADD_SQUARE = re.escape("add 'o_proj.weight', 'q_proj.weight' to transposed= (or, for one stored otherwise")


class TorchBlock(torch.nn.Module):
    """Square attention projections (WIDTH, WIDTH) beside an oblong MLP, all torch's Linear: weight (out, in)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.q_proj, self.o_proj = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        self.up_proj, self.down_proj = torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + self.o_proj(torch.tanh(self.q_proj(x)))
        return x + self.down_proj(torch.tanh(self.up_proj(x)))


class FlaxBlock(nn.Module):
    """The same block in flax: each Dense kernel (in, out)."""

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, WIDTH, name="embed")(tokens)
        x = x + nn.Dense(WIDTH, name="o_proj")(jnp.tanh(nn.Dense(WIDTH, name="q_proj")(x)))
        return x + nn.Dense(WIDTH, name="down_proj")(jnp.tanh(nn.Dense(HIDDEN, name="up_proj")(x)))


def _flax_path(name: str) -> str:
    """torch's ``q_proj.weight`` is flax's ``params/q_proj/kernel``, ``embed.weight`` its ``params/embed/embedding``."""
    module, tensor = name.split(".")
    return f"params/{module}/" + {"weight": "embedding" if module == "embed" else "kernel", "bias": "bias"}[tensor]


@pytest.fixture
def torch_folder(tmp_path):
    torch.manual_seed(0)
    model = TorchBlock()
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    return tmp_path, model


def test_a_flax_model_loads_a_torch_folder_only_with_every_linear_weight_turned(torch_folder):
    folder, model = torch_folder
    tokens = np.array([[1, 7, 3, 49]])
    like = FlaxBlock().init(jax.random.key(0), jnp.asarray(tokens))
    with pytest.raises(ArgumentError) as undecided:  # the square kernels' shapes cannot tell: transposed= must
        huggingface.load(folder, like, names=_flax_path)
    assert "pass transposed={'down_proj.weight', 'o_proj.weight', 'q_proj.weight', 'up_proj.weight'} if" in str(
        undecided.value
    )
    with pytest.raises(StructureMismatchError) as info:  # as stored, the oblong ones do not fit; the advice names the
        huggingface.load(folder, like, names=_flax_path, transposed=())  # square ones with them
    assert "pass transposed={'up_proj.weight'} if it is stored (out, in)" in str(info.value)
    assert "the square tensors of its kind, whose shapes cannot tell: ['o_proj.weight', 'q_proj.weight']" in str(
        info.value
    )

    oblong = {"up_proj.weight", "down_proj.weight"}  # what the advice for each oblong kernel alone would say
    with pytest.raises(ArgumentError) as refused:
        huggingface.load(folder, like, names=_flax_path, transposed=oblong)
    message = str(refused.value)
    assert message == (
        f"{folder}: transposed= turns 'down_proj.weight' over but not the square 'o_proj.weight', 'q_proj.weight' of "
        "the same kind ('weight' tensors filling 'kernel' leaves), whose shape fits either way and cannot tell how it "
        "is stored: a folder stores a kind one way round, so turn them all: add 'o_proj.weight', 'q_proj.weight' to "
        "transposed= (or, for one stored otherwise, as GPT-2's Conv1D.weight (in, out) beside a Linear's, leave it out "
        "of the load with names= and read it apart) (leaf 'params/o_proj/kernel': [8, 8])"
    )
    assert refused.value.path == "params/o_proj/kernel"
    with huggingface.open(folder) as reader, pytest.raises(ArgumentError, match=ADD_SQUARE):  # the reader's load too
        reader.load(like, names=_flax_path, transposed=lambda name: name in oblong)

    linear = {f"{module}.weight" for module in ("q_proj", "o_proj", "up_proj", "down_proj")}
    params = huggingface.load(folder, like, names=_flax_path, transposed=linear)
    with torch.no_grad():
        expected = model(torch.from_numpy(tokens)).numpy()
    np.testing.assert_allclose(FlaxBlock().apply(params, jnp.asarray(tokens)), expected, rtol=1e-5, atol=1e-6)
    with huggingface.open(folder, names=_flax_path, transposed=linear) as reader:
        np.testing.assert_array_equal(reader["params/q_proj/kernel"], model.q_proj.weight.detach().numpy().T)


def test_a_kind_left_out_whole_and_the_oblong_tensors_of_a_turned_kind_load_as_asked(torch_folder):
    folder, model = torch_folder
    linear = {f"{module}.weight" for module in ("q_proj", "o_proj", "up_proj", "down_proj")}
    with huggingface.open(folder, transposed=linear) as reader:  # by name: the embedding is oblong, its shape tells
        np.testing.assert_array_equal(reader["embed.weight"], model.embed.weight.detach().numpy())
        np.testing.assert_array_equal(reader["q_proj.weight"], model.q_proj.weight.detach().numpy().T)
    with pytest.raises(ArgumentError, match=ADD_SQUARE):
        huggingface.open(folder, transposed={"up_proj.weight"})
    params = huggingface.load(folder, names=_flax_path, transposed=(), as_numpy=True)  # every tensor as stored
    np.testing.assert_array_equal(params["params/q_proj/kernel"], model.q_proj.weight.detach().numpy())


class TorchConvNet(torch.nn.Module):
    """A conv of 3 channels to ``channels`` with a 3x3 window, weight (out, in, 3, 3), then a Linear."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, channels, 3), torch.nn.Linear(channels, 5)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(images).permute(0, 2, 3, 1))


class FlaxConvNet(nn.Module):
    """The same in flax, on images (batch, height, width, channels): kernels (3, 3, in, out) and (in, out)."""

    channels: int

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        return nn.Dense(5, name="fc")(nn.Conv(self.channels, (3, 3), padding="VALID", name="conv")(images))


def _conv_folder(tmp_path, channels: int):
    torch.manual_seed(0)
    model = TorchConvNet(channels)
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    images = np.random.default_rng(0).standard_normal((1, 5, 5, 3)).astype(np.float32)
    return tmp_path, model, images, FlaxConvNet(channels).init(jax.random.key(0), jnp.asarray(images))


def test_a_conv_weight_whose_shape_reads_alike_in_torch_and_flax_is_refused_beside_turned_linear_weights(tmp_path):
    folder, model, images, like = _conv_folder(tmp_path, 3)  # conv.weight (3, 3, 3, 3): OIHW and HWIO alike
    names = lambda name: "params/" + name.replace(".", "/").replace("weight", "kernel")  # noqa: E731
    with pytest.raises(ArgumentError) as refused:
        huggingface.load(folder, like, names=names, transposed={"fc.weight"})
    message = str(refused.value)
    assert message.startswith(f"{folder}: transposed= turns 'fc.weight' over but not 'conv.weight' of the same kind")
    assert message.endswith("numpy.moveaxis(weight, (0, 1), (-1, -2)) (leaf 'params/conv/kernel': [3, 3, 3, 3])")
    assert "reads alike as torch's Conv weight (out, in, *window) and flax's kernel (*window, in, out)" in message
    assert refused.value.path == "params/conv/kernel"

    # What the message says: the conv left out of the load, read apart and turned.
    without_conv = {"params": {"conv": {"bias": like["params"]["conv"]["bias"]}, "fc": like["params"]["fc"]}}
    params = huggingface.load(
        folder,
        without_conv,
        names=lambda name: None if name == "conv.weight" else names(name),
        transposed={"fc.weight"},
    )
    with huggingface.open(folder) as reader:
        params["params"]["conv"]["kernel"] = np.moveaxis(reader["conv.weight"], (0, 1), (-1, -2))
    with torch.no_grad():
        expected = model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
    np.testing.assert_allclose(FlaxConvNet(3).apply(params, jnp.asarray(images)), expected, rtol=1e-5, atol=1e-5)


def test_a_conv_weight_in_torchs_layout_where_like_has_flaxs_names_the_turn_to_make(tmp_path):
    folder, _, _, like = _conv_folder(tmp_path, 4)
    names = lambda name: "params/" + name.replace(".", "/").replace("weight", "kernel")  # noqa: E731
    with pytest.raises(StructureMismatchError) as info:
        huggingface.load(folder, like, names=names, transposed={"fc.weight"})
    assert str(info.value).endswith(
        "'params/conv/kernel': the file has float32[4, 3, 3, 3] (tensor 'conv.weight'), expected float32[3, 3, 3, 4]: "
        "torch's Conv weight (out, in, *window) where flax's kernel is (*window, in, out); transposed= turns only 2-d "
        "tensors: read it apart as stored (huggingface.open(folder)[name]) and turn it with "
        "numpy.moveaxis(weight, (0, 1), (-1, -2))"
    )
