"""An ``EquinoxOptaxModule`` whose model holds static values that ``==`` does not find equal to themselves once
loaded resumes like an uninterrupted run: a ``functools.partial`` activation (compared by identity) and a NaN
hyperparameter (``nan != nan``). Both were refused as "differing" from the module's own, and the NaN, once let
through, failed the first step: jax found the loaded optimiser state's NaN unlike the gradients'."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

from jaxstow import train


class Filled(eqx.Module):
    linear: eqx.nn.Linear
    fill: float = eqx.field(static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.nan_to_num(self.linear(x), nan=self.fill if self.fill == self.fill else 0.0)


MODELS = {
    "partial activation": lambda: eqx.nn.MLP(
        3, 1, 8, 2, activation=functools.partial(jax.nn.leaky_relu, negative_slope=0.1), key=jax.random.key(0)
    ),
    "NaN hyperparameter": lambda: Filled(eqx.nn.Linear(3, 1, key=jax.random.key(0)), float("nan")),
}


def _trainer(folder: Path, epochs: int, model: str) -> train.Trainer:
    def loss_fn(model: Any, batch: jax.Array) -> jax.Array:
        return jnp.mean((jax.vmap(model)(batch) - 1.0) ** 2)

    def batches(epoch: int) -> list[jax.Array]:
        return [jax.random.normal(jax.random.key(epoch), (16, 3))]

    module = train.EquinoxOptaxModule(MODELS[model](), optax.adam(0.1), loss_fn, batches)
    arguments = train.DefaultCheckpointerArguments(save_dir=folder, model_state_save_dir=folder, load_dir=folder)
    return train.Trainer(module, train.TrainerArguments(epochs=epochs, checkpointer_args=arguments))


@pytest.mark.parametrize("model", MODELS)
def test_a_model_with_such_static_values_resumes_like_an_uninterrupted_run(tmp_path: Path, model: str) -> None:
    uninterrupted = _trainer(tmp_path / "uninterrupted", 3, model).train()
    assert sorted(_trainer(tmp_path / "resumed", 1, model).train()) == [0]
    assert _trainer(tmp_path / "resumed", 3, model).train() == {epoch: uninterrupted[epoch] for epoch in (1, 2)}
