"""A run stopped after 3 of 5 epochs and resumed in a new process trains only epochs 3 and 4, and ends with exactly
the parameters of an uninterrupted 5-epoch run: for JAX (equinox + optax) and for PyTorch (nn.Module + SGD).

Run as a script (``python test_resume.py FRAMEWORK FOLDER EPOCHS``), this file is that new process: it resumes
from FOLDER and prints the epochs it trained as JSON.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import jaxstow
from jaxstow.train import DefaultCheckpointerArguments, Trainer, TrainerArguments

EPOCHS, FIRST_RUN, BATCHES = 5, 3, 4


@functools.cache
def _jax_training() -> tuple[Any, Callable[[int], list[Any]], Callable[[Any, Any], Any]]:
    """The optimiser, data and loss of the JAX runs, made once so that every run reuses one compiled step."""
    import jax
    import jax.numpy as jnp
    import optax

    def data(epoch: int) -> list[Any]:
        x = jax.random.normal(jax.random.key(epoch), (BATCHES, 16, 2))
        return list(zip(x, jnp.sin(x).sum(axis=-1, keepdims=True), strict=True))

    def loss_fn(model: Any, batch: Any) -> Any:
        x, y = batch
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    return optax.adam(1e-2), data, loss_fn


def _jax_module() -> Any:
    import equinox as eqx
    import jax

    optimizer, data, loss_fn = _jax_training()
    model = eqx.nn.MLP(2, 1, width_size=16, depth=2, key=jax.random.key(0))
    return jaxstow.train.EquinoxOptaxModule(model, optimizer, loss_fn, data)


def _jax_parameters(module_state: Any) -> list[np.ndarray]:
    import equinox as eqx
    import jax

    return [np.asarray(leaf) for leaf in jax.tree.leaves(eqx.filter(module_state["model"], eqx.is_array))]


def _torch_module() -> Any:
    torch = pytest.importorskip("torch")

    def loss_fn(model: Any, batch: Any) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    def data(epoch: int) -> list[Any]:
        x = torch.randn(BATCHES, 16, 2, generator=torch.Generator().manual_seed(epoch))
        return list(zip(x, torch.sin(x).sum(dim=-1, keepdim=True), strict=True))

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return jaxstow.train.TorchModule(model, optimizer, loss_fn, data)


def _torch_parameters(module_state: Any) -> list[np.ndarray]:
    return [tensor.numpy() for tensor in module_state["model"].values()]


FRAMEWORKS: dict[str, tuple[Callable[[], Any], Callable[[Any], list[np.ndarray]]]] = {
    "jax": (_jax_module, _jax_parameters),
    "torch": (_torch_module, _torch_parameters),
}


def _trainer(framework: str, epochs: int, folder: Path, *, resume: bool, checkpoint: bool = True) -> Trainer:
    build, _ = FRAMEWORKS[framework]
    checkpoints = DefaultCheckpointerArguments(
        checkpoint=checkpoint, save_dir=folder, model_state_save_dir=folder, load_dir=folder if resume else None
    )
    return Trainer(build(), TrainerArguments(epochs=epochs, checkpointer_args=checkpoints))


def _resume_in_new_process(framework: str, folder: Path, epochs: int) -> list[int]:
    result = subprocess.run(
        [sys.executable, __file__, framework, str(folder), str(epochs)],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_a_run_resumed_in_a_new_process_ends_like_an_uninterrupted_one(framework: str, tmp_path: Path) -> None:
    _, parameters = FRAMEWORKS[framework]
    assert sorted(_trainer(framework, FIRST_RUN, tmp_path, resume=False).train()) == [0, 1, 2]
    first_run_files = {f"checkpoint_{epoch}.jxs" for epoch in range(FIRST_RUN)} | {"checkpoint_model_2.jxs"}
    assert set(os.listdir(tmp_path)) == first_run_files

    assert _resume_in_new_process(framework, tmp_path, EPOCHS) == [3, 4]
    assert set(os.listdir(tmp_path)) == first_run_files | {
        "checkpoint_3.jxs",
        "checkpoint_4.jxs",
        "checkpoint_model_4.jxs",
    }
    last = jaxstow.load(tmp_path / "checkpoint_4.jxs")
    assert last.trainer_state == {"last_epoch": 4, "optimizers": [], "schedulers": []}
    assert last.trainer_backend_state == {"global_step": EPOCHS * BATCHES}

    uninterrupted = _trainer(framework, EPOCHS, tmp_path / "uninterrupted", resume=False, checkpoint=False)
    uninterrupted.train()
    expected = parameters(uninterrupted.module.get_state())
    resumed = parameters(jaxstow.load(tmp_path / "checkpoint_model_4.jxs"))
    assert len(resumed) == len(expected) > 0
    for found, wanted in zip(resumed, expected, strict=True):
        np.testing.assert_array_equal(found, wanted)


if __name__ == "__main__":
    framework, folder, epochs = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    trained = _trainer(framework, epochs, folder, resume=True).train()
    print(json.dumps(sorted(trained)))
