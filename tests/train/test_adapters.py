"""The ready module interfaces refuse a checkpoint of another model with an error naming what differs."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

from jaxstow import train
from jaxstow.errors import CheckpointError, StructureMismatchError
from jaxstow.train import EquinoxOptaxModule


def _module(width: int, dtype: Any = jnp.float32) -> EquinoxOptaxModule:
    model = eqx.nn.MLP(2, 1, width_size=width, depth=1, key=jax.random.key(0), dtype=dtype)
    loss = lambda model, batch: jnp.mean(jax.vmap(model)(batch) ** 2)  # noqa: E731
    return EquinoxOptaxModule(model, optax.sgd(0.1), loss, lambda epoch: [jnp.ones((3, 2), dtype)])


def test_equinox_module_takes_a_state_of_the_same_model() -> None:
    module, other = _module(4), _module(4)
    other.model = eqx.tree_at(lambda m: m.layers[0].bias, other.model, jnp.ones(4))
    module.update_state(other.get_state())
    assert module.model is other.model and module.opt_state is other.opt_state


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (
            lambda: _module(8),
            r"the checkpoint's 'model': layers/0/weight is float32\[8, 2\], expected float32\[4, 2\]",
        ),
        (lambda: _module(4, jnp.float16), r"layers/0/bias is float16\[4\], expected float32\[4\]"),
    ],
    ids=["wider", "float16"],
)
def test_equinox_module_refuses_a_state_of_another_model(other: Any, message: str) -> None:
    with pytest.raises(StructureMismatchError, match=message):
        _module(4).update_state(other().get_state())


def test_equinox_module_refuses_a_state_of_other_functions() -> None:
    # The file's relu went on silently where the code built the model with gelu (the same arrays).
    module = _module(4)
    gelu = eqx.nn.MLP(2, 1, width_size=4, depth=1, activation=jax.nn.gelu, key=jax.random.key(0))
    module.model = gelu
    with pytest.raises(StructureMismatchError, match="activation is relu in the file, but gelu in this module"):
        module.update_state(_module(4).get_state())


def test_equinox_module_refuses_a_pytorch_state() -> None:
    with pytest.raises(
        StructureMismatchError,
        match=r"'model': missing array layers/0/weight\n.*'model': missing array layers/0/bias",
    ):
        _module(4).update_state({"model": {"0.weight": None}, "opt_state": ()})
    with pytest.raises(CheckpointError, match=r"holds \['model'\], not the 'model' and 'opt_state'"):
        _module(4).update_state({"model": {"0.weight": None}})


def test_a_trainer_resumed_with_another_model_names_the_file_and_how_to_resume(tmp_path) -> None:
    folder = str(tmp_path)
    checkpointer = train.DefaultCheckpointerArguments(save_dir=folder, model_state_save_dir=folder, load_dir=folder)
    arguments = train.TrainerArguments(epochs=2, checkpointer_args=checkpointer)
    train.Trainer(_module(4), arguments).train()
    wider = rf"{tmp_path}/checkpoint_1\.jxs does not fit .*\n.*'model': layers/0/weight is float32\[4, 2\], expected"
    with pytest.raises(StructureMismatchError, match=wider + r"(.|\n)*start afresh: load_dir=None"):
        train.Trainer(_module(8), arguments)
    train.Trainer(_module(4), arguments)  # its own model resumes
