"""Train a small equinox + optax model with a CheckpointManager (async saves, keep_last=3, keep_best=1 on the loss),
kill the training process with SIGKILL in the middle of the run, resume from the latest committed step, and finish
with exactly the parameters of an uninterrupted run.

Run: python examples/demo_4_training.py
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstow import CheckpointManager, KeepPolicy

STEPS = 300
SAVE_EVERY = 10
KILL_AFTER = 150
OPTIMIZER = optax.adam(3e-3)


@jax.jit
def batch(step: int) -> tuple[jax.Array, jax.Array]:
    """The samples of one step (noisy sin(x0) + cos(x1)); the same in every process."""
    key = jax.random.fold_in(jax.random.key(1), step)
    x = jax.random.normal(key, (64, 2))
    noise = 0.1 * jax.random.normal(jax.random.fold_in(key, 1), (64, 1))
    return x, jnp.sin(x[:, :1]) + jnp.cos(x[:, 1:]) + noise


@eqx.filter_jit
def train_step(model: eqx.nn.MLP, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[eqx.nn.MLP, Any, jax.Array]:
    def loss_fn(model: eqx.nn.MLP) -> jax.Array:
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


@eqx.filter_jit
def initial_state() -> dict[str, Any]:
    model = eqx.nn.MLP(2, 1, width_size=32, depth=2, key=jax.random.key(0))
    return {"model": model, "opt_state": OPTIMIZER.init(eqx.filter(model, eqx.is_array))}


def train(folder: str | None, *, report_saves: bool = False) -> eqx.nn.MLP:
    """Run the training to ``STEPS`` updates, resuming from ``folder``'s latest step, saving every ``SAVE_EVERY``."""
    state = initial_state()
    done = 0
    manager = None
    if folder is not None:
        manager = CheckpointManager(folder, keep=KeepPolicy(keep_last=3, keep_best=1, metric="loss"))
        if manager.latest_step() is not None:
            done = manager.latest_step() or 0
            state = manager.restore(done, like=state)
            print(f"   resuming from step {done} (loss {manager.metrics(done)['loss']:.4f})", flush=True)
    model, opt_state = state["model"], state["opt_state"]
    for step in range(done + 1, STEPS + 1):
        model, opt_state, loss = train_step(model, opt_state, *batch(step))
        if manager is not None and step % SAVE_EVERY == 0:
            manager.save(step, {"model": model, "opt_state": opt_state}, metrics={"loss": loss})
            if report_saves:
                print(f"  step {step}: saved (loss {float(loss):.4f})", flush=True)
    if manager is not None:
        manager.close()
    return model


def parameters(model: eqx.nn.MLP) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(eqx.filter(model, eqx.is_array))]


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="  log: %(message)s")
    with tempfile.TemporaryDirectory() as folder:
        print(
            f"1. a training process: {STEPS} steps, an async save every {SAVE_EVERY} (keep_last=3, keep_best=1 on loss)"
        )
        child = subprocess.Popen(
            [sys.executable, __file__, "--train", folder], stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="")
            if line.startswith(f"  step {KILL_AFTER}:"):
                child.send_signal(signal.SIGKILL)
                break
        child.wait()
        child.stdout.close()
        assert child.returncode == -signal.SIGKILL, f"the training process ended on its own ({child.returncode})"
        print(f"2. killed with SIGKILL after it reported step {KILL_AFTER}")
        reader = CheckpointManager(folder)
        steps = reader.steps()
        leftovers = sorted(set(os.listdir(folder)) - {str(step) for step in steps} - {".jaxstow.lock"})
        print(f"   committed steps on disk: {steps}; losses: {[round(reader.metrics(s)['loss'], 4) for s in steps]}")
        if leftovers:
            print(f"   an unfinished save left {leftovers}: never listed, removed when the next writer starts")

        print("3. this process, a new one, resumes from the latest committed step")
        resumed = train(folder)
        with CheckpointManager(folder) as manager:
            steps = manager.steps()
            best = min(steps, key=lambda step: manager.metrics(step)["loss"])
            print(f"   finished at step {steps[-1]}; kept steps {steps}: the last 3, and the best loss at step {best}")
        print("4. an uninterrupted run for comparison")
        reference = train(None)
        same = all(np.array_equal(a, b) for a, b in zip(parameters(resumed), parameters(reference), strict=True))
        print(f"   parameters of the resumed run equal those of the uninterrupted run, bit for bit: {same}")
        assert same


if __name__ == "__main__":
    if sys.argv[1:2] == ["--train"]:
        train(sys.argv[2], report_saves=True)
    else:
        main()
