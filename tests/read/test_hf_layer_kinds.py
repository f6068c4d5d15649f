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
#: The end of the refusal of a transposed= that leaves out the square kernels.
ADD_SQUARE = re.escape("add 'o_proj.weight', 'q_proj.weight' to transposed=")


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
    with pytest.raises(StructureMismatchError) as info:  # the oblong kernels do not fit: the advice names the square
        huggingface.load(folder, like, names=_flax_path)
    assert "pass transposed={'up_proj.weight'} if it is stored (out, in)" in str(info.value)
    assert "the square tensors of its kind, whose shapes cannot tell: ['o_proj.weight', 'q_proj.weight']" in str(
        info.value
    )

    oblong = {"up_proj.weight", "down_proj.weight"}  # what the advice for each oblong kernel alone would say
    with pytest.raises(ArgumentError) as refused:
        huggingface.load(folder, like, names=_flax_path, transposed=oblong)
    message = str(refused.value)
    assert message.startswith(f"{folder}: transposed= turns 'down_proj.weight' over but not 'o_proj.weight' (leaf ")
    assert (
        "'params/o_proj/kernel'), a square [8, 8] tensor of the same kind ('weight' tensors filling 'kernel' "
        in message
    )
    assert message.endswith("add 'o_proj.weight', 'q_proj.weight' to transposed=")
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
    params = huggingface.load(folder, names=_flax_path, as_numpy=True)  # nothing turned: every tensor as stored
    np.testing.assert_array_equal(params["params/q_proj/kernel"], model.q_proj.weight.detach().numpy())
