"""Train an equinox model for 3 of 5 epochs, stop, and resume in a new process, which trains only epochs 3 and 4 and
ends with exactly the parameters of an uninterrupted 5-epoch run.

Both runs are configured alike, with ``load_dir = save_dir``: the first finds nothing and starts from scratch, the
second finds the checkpoint of epoch 2 and goes on from there.

Run: python examples/demo_5_resume.py
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxstow
from jaxstow.train import DefaultCheckpointerArguments, EquinoxOptaxModule, Trainer, TrainerArguments

EPOCHS = 5
OPTIMIZER = optax.adam(1e-2)


def data(epoch: int) -> list[tuple[jax.Array, jax.Array]]:
    """Four batches of noisy samples of sin(x0) + cos(x1); the same in every process for a given epoch."""
    x = jax.random.normal(jax.random.key(epoch), (4, 32, 2))
    return list(zip(x, jnp.sin(x[..., :1]) + jnp.cos(x[..., 1:]), strict=True))


def loss_fn(model: eqx.nn.MLP, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def trainer(epochs: int, folder: str, *, checkpoint: bool = True) -> Trainer:
    model = eqx.nn.MLP(2, 1, width_size=32, depth=2, key=jax.random.key(0))
    checkpoints = DefaultCheckpointerArguments(
        checkpoint=checkpoint, save_dir=folder, model_state_save_dir=folder, load_dir=folder if checkpoint else None
    )
    module = EquinoxOptaxModule(model, OPTIMIZER, loss_fn, data)
    return Trainer(module, TrainerArguments(epochs=epochs, checkpointer_args=checkpoints))


def parameters(module_state: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(eqx.filter(module_state["model"], eqx.is_array))]


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        print(f"first run: 3 of {EPOCHS} epochs, checkpoints in {folder}")
        trainer(3, folder).train()
        print(f"  files: {' '.join(sorted(os.listdir(folder)))}")

        print(f"the run stops; a new Python process resumes it with epochs={EPOCHS}:", flush=True)
        subprocess.run([sys.executable, __file__, "--resume", folder], check=True)
        print(f"  files: {' '.join(sorted(os.listdir(folder)))}")

        logging.disable(logging.INFO)
        uninterrupted = trainer(EPOCHS, folder, checkpoint=False)
        uninterrupted.train()
        logging.disable(logging.NOTSET)
        expected = parameters(uninterrupted.module.get_state())
        resumed = parameters(jaxstow.load(os.path.join(folder, f"checkpoint_model_{EPOCHS - 1}.jxs")))
        same = all(np.array_equal(a, b) for a, b in zip(resumed, expected, strict=True))
        print(f"the resumed run ends with exactly the parameters of an uninterrupted {EPOCHS}-epoch run: {same}")
        if not same:
            raise SystemExit("the resumed run diverged from the uninterrupted one")


if __name__ == "__main__":
    # Show jaxstow's own log (what the checkpointer and the trainer do), indented under the demo's lines.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("  %(message)s"))
    logging.getLogger("jaxstow").addHandler(handler)
    logging.getLogger("jaxstow").setLevel(logging.INFO)
    if sys.argv[1:2] == ["--resume"]:
        trained = trainer(EPOCHS, sys.argv[2]).train()
        print(f"  the new process trained epochs {sorted(trained)}")
    else:
        main()
