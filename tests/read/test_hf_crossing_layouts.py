"""torch's ``weight`` (out, in) filling flax's ``kernel`` (in, out) where no shape tells: only as transposed= says.

Real torch modules write the folders; the flax (linen and nnx) and equinox models that load them must compute what
torch computes on the same input, or the load must be refused, naming the ``transposed=`` to pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxstow
from jaxstow import huggingface
from jaxstow.errors import ArgumentError

torch = pytest.importorskip("torch")
save_torch = pytest.importorskip("safetensors.torch").save_file

WIDTH = 16
INPUTS = np.random.default_rng(0).standard_normal((3, WIDTH)).astype(np.float32)


class FlaxMLP(nn.Module):
    """torch's ``Sequential(Linear, ReLU, Linear)`` in flax.linen, named as ``nn.Sequential`` names its layers."""

    activation: Callable[[jax.Array], jax.Array] = nn.relu

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(WIDTH, name="layers_2")(self.activation(nn.Dense(WIDTH, name="layers_0")(x)))


class NnxMLP(nnx.Module):
    def __init__(self) -> None:
        self.layer0, self.layer2 = (
            nnx.Linear(WIDTH, WIDTH, rngs=nnx.Rngs(0)),
            nnx.Linear(WIDTH, WIDTH, rngs=nnx.Rngs(1)),
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.layer2(nnx.relu(self.layer0(x)))


def _equinox_mlp() -> tuple[eqx.nn.Sequential, eqx.nn.Sequential]:
    """The MLP in equinox, whose Linear.weight is (out, in) as torch's: its arrays, and the rest."""
    keys = jax.random.split(jax.random.key(1), 2)
    layers = [
        eqx.nn.Linear(WIDTH, WIDTH, key=keys[0]),
        eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.Linear(WIDTH, WIDTH, key=keys[1]),
    ]
    return eqx.partition(eqx.nn.Sequential(layers), eqx.is_array)


def _linen_path(name: str) -> str:
    return "params/layers_" + name.replace(".", "/").replace("weight", "kernel")


def _torch_folder(tmp_path, model, inputs=INPUTS):
    """``model``'s state dict saved as ``save_pretrained`` saves it, and what it computes on ``inputs`` (if any)."""
    tmp_path.mkdir(exist_ok=True)
    save_torch(model.state_dict(), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    if inputs is None:
        return tmp_path, None
    with torch.no_grad():
        return tmp_path, model(torch.from_numpy(inputs)).numpy()


@pytest.fixture
def square_mlp(tmp_path):
    torch.manual_seed(0)
    return _torch_folder(
        tmp_path, torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
    )


def test_a_torch_mlp_of_square_linears_loads_into_flax_only_as_transposed_says(square_mlp):
    folder, expected = square_mlp
    like = FlaxMLP().init(jax.random.key(0), INPUTS)
    with pytest.raises(ArgumentError) as refused:  # loaded as stored, every layer turned over, silently
        huggingface.load(folder, like, names=_linen_path)
    assert str(refused.value) == (
        f"{folder}: names= fills 'kernel' leaves with 'weight' tensors, across two layouts (torch's Linear.weight is "
        "(out, in), flax's Dense kernel (in, out)), and transposed= turns none of them; no shape tells how this "
        "folder stores '0.weight', '2.weight' (square: either way round fits): pass transposed={'0.weight', "
        "'2.weight'} if its 2-d 'weight' tensors are stored (out, in), as torch's Linear writes them; or pass "
        "transposed=() if every tensor is stored as its leaf holds it, as GPT-2's Conv1D.weight is (in, out) "
        "(leaf 'params/layers_0/kernel': [16, 16])"
    )
    assert refused.value.path == "params/layers_0/kernel"
    with pytest.raises(ArgumentError, match="transposed= turns none of them"):  # a predicate that marks none
        huggingface.load(folder, like, names=_linen_path, transposed=lambda name: name.endswith("proj.weight"))
    with pytest.raises(ArgumentError, match="transposed= turns none of them"):  # the reader too
        huggingface.open(folder, names=_linen_path)
    with huggingface.open(folder) as reader:  # a set built from the names, which happens to match none
        built = {name for name in reader.paths if name.endswith("proj.weight")}
    for marks_none in (built, [], iter(())):
        with pytest.raises(ArgumentError, match="transposed= turns none of them"):
            huggingface.load(folder, like, names=_linen_path, transposed=marks_none)

    params = huggingface.load(folder, like, names=_linen_path, transposed={"0.weight", "2.weight"})
    np.testing.assert_allclose(FlaxMLP().apply(params, INPUTS), expected, rtol=1e-5, atol=1e-6)
    as_stored = huggingface.load(folder, like, names=_linen_path, transposed=(), as_numpy=True)  # said outright
    with huggingface.open(folder) as reader:
        np.testing.assert_array_equal(as_stored["params"]["layers_0"]["kernel"], reader["0.weight"])
    with huggingface.open(folder, names=_linen_path, transposed=()) as reader:  # opened as stored, loaded so
        np.testing.assert_array_equal(
            reader.load(like, as_numpy=True)["params"]["layers_0"]["kernel"], as_stored["params"]["layers_0"]["kernel"]
        )

    graph, state = nnx.split(NnxMLP())
    pure = nnx.to_pure_dict(state)
    nnx_path = lambda name: "layer" + name.replace(".", "/").replace("weight", "kernel")  # noqa: E731
    with pytest.raises(ArgumentError, match=r"pass transposed=\{'0.weight', '2.weight'\} if"):
        huggingface.load(folder, pure, names=nnx_path)
    nnx.replace_by_pure_dict(
        state, huggingface.load(folder, pure, names=nnx_path, transposed=lambda name: "weight" in name)
    )
    np.testing.assert_allclose(nnx.merge(graph, state)(INPUTS), expected, rtol=1e-5, atol=1e-6)


def test_weights_whose_names_keep_their_layout_load_as_stored_without_transposed(square_mlp, tmp_path):
    folder, expected = square_mlp
    params, static = _equinox_mlp()  # equinox's weight is torch's (out, in)
    loaded = huggingface.load(folder, params, names=lambda name: "layers/" + name.replace(".", "/"))
    np.testing.assert_allclose(jax.vmap(eqx.combine(loaded, static))(INPUTS), expected, rtol=1e-5, atol=1e-6)

    like = FlaxMLP().init(jax.random.key(2), INPUTS)  # flax's own kernels, exported and read back: kernel to kernel
    jaxstow.save(tmp_path / "flax.jxs", like)
    huggingface.export_safetensors(tmp_path / "flax.jxs", tmp_path / "exported")
    again = huggingface.load(tmp_path / "exported", FlaxMLP().init(jax.random.key(3), INPUTS))
    np.testing.assert_array_equal(FlaxMLP().apply(again, INPUTS), FlaxMLP().apply(like, INPUTS))

    torch.manual_seed(0)  # a square embedding: torch's (count, width) is flax's Embed table as it is
    tokens = np.array([[3, 0, 15]])
    embed_folder, embedded = _torch_folder(tmp_path / "embed", torch.nn.Embedding(WIDTH, WIDTH), tokens)
    embed = nn.Embed(WIDTH, WIDTH)
    table = huggingface.load(embed_folder, embed.init(jax.random.key(0), tokens), names=lambda name: "params/embedding")
    np.testing.assert_array_equal(embed.apply(table, tokens), embedded)


class Conv1D(torch.nn.Module):
    """GPT-2's Conv1D (transformers.pytorch_utils): a Linear whose weight is stored (in, out), flax's layout."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = torch.nn.Parameter(torch.randn(nf) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight)


def test_gpt2s_square_conv1d_weights_load_as_stored_when_transposed_says_so(tmp_path):
    torch.manual_seed(0)
    folder, expected = _torch_folder(
        tmp_path, torch.nn.Sequential(Conv1D(WIDTH, WIDTH), torch.nn.Tanh(), Conv1D(WIDTH, WIDTH))
    )
    like = FlaxMLP().init(jax.random.key(0), INPUTS)
    with pytest.raises(ArgumentError, match=re.escape("or pass transposed=() if every tensor is stored as its leaf")):
        huggingface.load(folder, like, names=_linen_path)
    params = huggingface.load(folder, like, names=_linen_path, transposed=())
    np.testing.assert_allclose(FlaxMLP(jnp.tanh).apply(params, INPUTS), expected, rtol=1e-5, atol=1e-6)


def test_a_partial_load_of_the_square_kernels_beside_oblong_ones_needs_transposed(tmp_path):
    torch.manual_seed(0)  # the oblong up-projection would tell the layout, but the template leaves it unread
    folder, _ = _torch_folder(
        tmp_path, torch.nn.ModuleDict({"q": torch.nn.Linear(8, 8), "up": torch.nn.Linear(8, 32)}), None
    )
    like = {"q": {"kernel": jnp.zeros((8, 8)), "bias": jnp.zeros(8)}}
    names = lambda name: name.replace(".", "/").replace("weight", "kernel")  # noqa: E731
    with pytest.raises(ArgumentError, match=re.escape("pass transposed={'q.weight', 'up.weight'} if")):
        huggingface.load(folder, like, names=names, partial=True)
    loaded = huggingface.load(folder, like, names=names, transposed={"q.weight", "up.weight"}, partial=True)
    with huggingface.open(folder) as reader:
        np.testing.assert_array_equal(loaded["q"]["kernel"], reader["q.weight"].T)


def test_a_conv_weight_whose_shape_reads_alike_both_ways_is_refused_without_transposed(tmp_path):
    torch.manual_seed(0)  # (3, 3, 3, 3): torch's (out, in, 3, 3) and flax's (3, 3, in, out) alike
    folder, _ = _torch_folder(tmp_path, torch.nn.ModuleDict({"conv": torch.nn.Conv2d(3, 3, 3)}), None)
    like = {"conv": {"kernel": jnp.zeros((3, 3, 3, 3)), "bias": jnp.zeros(3)}}
    with pytest.raises(ArgumentError) as refused:
        huggingface.load(folder, like, names=lambda name: name.replace(".", "/").replace("weight", "kernel"))
    assert (
        "no shape tells how this folder stores 'conv.weight' (torch's conv weight (out, in, *window) and flax's kernel"
        in str(refused.value)
    )
    assert str(refused.value).endswith(
        "turned with numpy.moveaxis(weight, (0, 1), (-1, -2)); or pass transposed=() if every tensor is stored as its "
        "leaf holds it, as GPT-2's Conv1D.weight is (in, out) (leaf 'conv/kernel': [3, 3, 3, 3])"
    )


def test_flaxs_square_kernels_load_into_equinox_weights_only_as_transposed_says(tmp_path):
    like = FlaxMLP().init(jax.random.key(0), INPUTS)  # flax's (in, out) kernels, exported, into equinox's (out, in)
    jaxstow.save(tmp_path / "flax.jxs", like)
    huggingface.export_safetensors(tmp_path / "flax.jxs", tmp_path / "exported")
    params, static = _equinox_mlp()
    names = lambda name: name.replace("params.layers_", "layers/").replace(".", "/").replace("kernel", "weight")  # noqa: E731
    with pytest.raises(
        ArgumentError, match=re.escape("if its 2-d 'kernel' tensors are stored (in, out), as flax's Dense")
    ):
        huggingface.load(tmp_path / "exported", params, names=names)
    kernels = {"params.layers_0.kernel", "params.layers_2.kernel"}
    loaded = huggingface.load(tmp_path / "exported", params, names=names, transposed=kernels)
    np.testing.assert_allclose(
        jax.vmap(eqx.combine(loaded, static))(INPUTS), FlaxMLP().apply(like, INPUTS), rtol=1e-5, atol=1e-6
    )


def test_torch_weights_into_an_nnx_models_variables_load_only_as_transposed_says(square_mlp, tmp_path):
    folder, expected = square_mlp  # nnx's State and Module hold each array at 'layer0/kernel/value'
    graph, state = nnx.split(NnxMLP())
    names = lambda name: "layer" + name.replace(".", "/").replace("weight", "kernel") + "/value"  # noqa: E731
    for like in (state, NnxMLP()):
        with pytest.raises(ArgumentError, match=r"pass transposed=\{'0.weight', '2.weight'\} if") as refused:
            huggingface.load(folder, like, names=names)
        assert refused.value.path == "layer0/kernel/value"
    loaded = huggingface.load(folder, state, names=names, transposed={"0.weight", "2.weight"})
    np.testing.assert_allclose(nnx.merge(graph, loaded)(INPUTS), expected, rtol=1e-5, atol=1e-6)
    module = huggingface.load(folder, NnxMLP(), names=names, transposed=lambda name: name.endswith("weight"))
    np.testing.assert_allclose(module(INPUTS), expected, rtol=1e-5, atol=1e-6)

    jaxstow.save(tmp_path / "nnx.jxs", loaded)  # exported: 'layer0.kernel.value', into equinox's (out, in) weight
    huggingface.export_safetensors(tmp_path / "nnx.jxs", tmp_path / "exported")
    params, static = _equinox_mlp()

    def eqx_names(name: str) -> str:  # 'layer0.kernel.value' -> 'layers/0/weight'
        layer = name.removeprefix("layer").removesuffix(".value").replace("kernel", "weight")
        return "layers/" + layer.replace(".", "/")

    with pytest.raises(ArgumentError, match="if its 2-d 'kernel' tensors are stored"):
        huggingface.load(tmp_path / "exported", params, names=eqx_names)
    turned = huggingface.load(tmp_path / "exported", params, names=eqx_names, transposed=lambda name: "kernel" in name)
    np.testing.assert_allclose(jax.vmap(eqx.combine(turned, static))(INPUTS), expected, rtol=1e-5, atol=1e-6)


class TorchDecoder(torch.nn.Module):
    """A decoder named as Llama's: ``model.layers.0.self_attn.q_proj.weight``, ``model.embed_tokens.weight``, ..."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        block = lambda: torch.nn.ModuleDict(  # noqa: E731
            {
                "input_layernorm": torch.nn.LayerNorm(WIDTH),
                "self_attn": torch.nn.ModuleDict(
                    {f"{x}_proj": torch.nn.Linear(WIDTH, WIDTH, bias=False) for x in "qkvo"}
                ),
                "mlp": torch.nn.ModuleDict(
                    {"up_proj": torch.nn.Linear(WIDTH, 32), "down_proj": torch.nn.Linear(32, WIDTH)}
                ),
            }
        )
        self.model = torch.nn.ModuleDict(
            {
                "embed_tokens": torch.nn.Embedding(40, WIDTH),
                "layers": torch.nn.ModuleList([block() for _ in range(layers)]),
            }
        )
        self.lm_head = torch.nn.Linear(WIDTH, 40, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.model["embed_tokens"](tokens)
        for layer in self.model["layers"]:
            h, attn, mlp = layer["input_layernorm"](x), layer["self_attn"], layer["mlp"]
            x = x + attn["o_proj"](attn["q_proj"](h) * torch.sigmoid(attn["k_proj"](h)) + attn["v_proj"](h))
            x = x + mlp["down_proj"](torch.relu(mlp["up_proj"](x)))
        return self.lm_head(x)


class FlaxDecoder(nn.Module):
    """TorchDecoder in flax.linen, its layers' modules named ``layers_0_q_proj``, ``layers_0_input_layernorm``, ..."""

    layers: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(40, WIDTH, name="embed_tokens")(tokens)
        for index in range(self.layers):
            q, k, v, o = (nn.Dense(WIDTH, use_bias=False, name=f"layers_{index}_{x}_proj") for x in "qkvo")
            up, down = nn.Dense(32, name=f"layers_{index}_up_proj"), nn.Dense(WIDTH, name=f"layers_{index}_down_proj")
            h = nn.LayerNorm(epsilon=1e-5, name=f"layers_{index}_input_layernorm")(x)
            x = x + o(q(h) * nn.sigmoid(k(h)) + v(h))
            x = x + down(nn.relu(up(x)))
        return nn.Dense(40, use_bias=False, name="lm_head")(x)


def _decoder_path(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``params/layers_0_q_proj/kernel``, as FlaxDecoder names it."""
    module, leaf = name.removeprefix("model.").rsplit(".", 1)
    module = re.sub(r"layers\.(\d+)\.(self_attn\.|mlp\.)?", r"layers_\1_", module)
    if leaf == "weight":
        leaf = "scale" if module.endswith("layernorm") else "embedding" if module == "embed_tokens" else "kernel"
    return f"params/{module}/{leaf}"


def test_the_transposed_a_refusal_names_for_many_layers_pasted_as_is_loads_torchs_model(tmp_path):
    torch.manual_seed(0)
    tokens = np.array([[3, 0, 39, 7]])
    folder, expected = _torch_folder(tmp_path, TorchDecoder(layers=4), tokens)
    like = FlaxDecoder(layers=4).init(jax.random.key(0), tokens)
    with pytest.raises(ArgumentError) as refused:
        huggingface.load(folder, like, names=_decoder_path)
    message = str(refused.value)
    assert "and 11 more (square: either way round fits)" in message  # 16 square projections, 25 2-d weights
    suggested = re.search(r"pass transposed=(.+) if its 2-d 'weight' tensors", message)
    assert suggested is not None, message
    params = huggingface.load(folder, like, names=_decoder_path, transposed=eval(suggested[1]))  # pasted as is
    np.testing.assert_allclose(FlaxDecoder(layers=4).apply(params, tokens), expected, rtol=1e-4, atol=1e-5)
