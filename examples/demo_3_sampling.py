"""Stream posterior samples out of a jit-compiled sampler into an HDF5 file: 4 SGLD chains under vmap.

A stochastic-gradient Langevin sampler, written in plain JAX, samples the posterior of a Bayesian logistic
regression on synthetic data. Four chains run at once under ``jax.vmap`` inside one ``jax.jit``, each with the saving
state that ``init_save`` gave it under ``vmap``; every kept sample leaves the device through ``jaxstow.io.save`` and
lands in an HDF5 file while the chains run. The file then goes to ArviZ with ``jaxstow.io.to_inference_data``: a
summary (means, R-hat, effective sample sizes) and a trace plot, written to ``examples/out/sampling_trace.png``.

Run: python examples/demo_3_sampling.py
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings

import h5py
import jax
import jax.numpy as jnp
import numpy as np

from jaxstow import io

warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")  # ArviZ announces its 1.0 refactor
import arviz as az  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # draws to files, with no display needed
import matplotlib.pyplot as plt  # noqa: E402

CHAINS = 4
STEPS = 4000
BURN_IN = 1000
THIN = 10
BATCH = 64
STEP_SIZE = 2e-3
TRUE = {"w": jnp.array([1.5, -2.0, 0.5]), "b": jnp.float32(0.3)}
PLOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "sampling_trace.png")


def make_data(key: jax.Array, count: int = 1000) -> tuple[jax.Array, jax.Array]:
    """Features and labels drawn from the logistic model with the TRUE parameters."""
    x_key, y_key = jax.random.split(key)
    x = jax.random.normal(x_key, (count, 3))
    y = jax.random.bernoulli(y_key, jax.nn.sigmoid(x @ TRUE["w"] + TRUE["b"]))
    return x, y.astype(jnp.float32)


def log_posterior(theta: dict[str, jax.Array], x: jax.Array, y: jax.Array, scale: float) -> jax.Array:
    """A minibatch estimate: standard normal prior plus ``scale`` times the batch's log likelihood."""
    logits = x @ theta["w"] + theta["b"]
    log_likelihood = jnp.sum(y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits))
    log_prior = -0.5 * (jnp.sum(theta["w"] ** 2) + theta["b"] ** 2)
    return log_prior + scale * log_likelihood


def sgld_chain(save, saving_state, theta, key, x, y):
    """One chain: STEPS Langevin steps on minibatches, keeping every THIN-th sample after the burn-in."""
    scale = x.shape[0] / BATCH

    def step(carry, t):
        saving_state, theta, key = carry
        key, batch_key, noise_key = jax.random.split(key, 3)
        rows = jax.random.randint(batch_key, (BATCH,), 0, x.shape[0])
        grad = jax.grad(log_posterior)(theta, x[rows], y[rows], scale)
        noise = {"w": jax.random.normal(noise_key, (3,)), "b": jax.random.normal(jax.random.fold_in(noise_key, 1), ())}
        theta = jax.tree.map(lambda p, g, n: p + 0.5 * STEP_SIZE * g + jnp.sqrt(STEP_SIZE) * n, theta, grad, noise)
        keep = (t >= BURN_IN) & (t % THIN == 0)
        saving_state, _ = save(saving_state, keep, theta)
        return (saving_state, theta, key), None

    (saving_state, _, _), _ = jax.lax.scan(step, (saving_state, theta, key), jnp.arange(STEPS))
    return saving_state


def main() -> None:
    x, y = make_data(jax.random.key(0))
    truth = np.append(np.asarray(TRUE["w"]), float(TRUE["b"]))
    print(f"data: {x.shape[0]} points, 3 features; true (w, b) = {np.round(truth, 2)}")
    kept = (STEPS - BURN_IN) // THIN
    print(
        f"SGLD: {CHAINS} chains under vmap, {STEPS} steps each, burn-in {BURN_IN}, every {THIN}th sample kept ({kept})"
    )

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "posterior.h5")
        # Given the path, the collector opens the file itself, so that other processes may read it while it is
        # written (jaxstow watch, io.to_inference_data), and closes it when the last chain is done.
        init_save, save, postprocess_save = io.save(io.HDF5Collector(path))
        sample = {"w": jnp.zeros(3), "b": jnp.float32(0.0)}
        information = io.scheduler.static_information(samples_collected=kept)
        # Called under vmap, init_save registers one chain per element and gives each a saving state of its own.
        states = jax.vmap(lambda _: init_save(sample, None, information))(jnp.arange(CHAINS))
        start_key, chain_key = jax.random.split(jax.random.key(1))
        starts = {"w": 3.0 * jax.random.normal(start_key, (CHAINS, 3)), "b": jnp.zeros(CHAINS)}
        keys = jax.random.split(chain_key, CHAINS)

        run = jax.jit(jax.vmap(lambda s, t, k: sgld_chain(save, s, t, k, x, y)), donate_argnums=0)
        print(f"running the chains (one jit-compiled call); samples stream into {path} as they are kept...")
        start = time.perf_counter()
        results = postprocess_save(run(states, starts, keys), None)
        print(f"  done in {time.perf_counter() - start:.1f} s, compilation included")

        print("the file holds one dataset per leaf and chain, and the samples each chain has written:")
        with h5py.File(path, "r") as file:
            for name, item in sorted(file.items()):
                if isinstance(item, h5py.Group):
                    for leaf, dataset in sorted(item.items()):
                        print(f"  /{name}/{leaf}: shape {dataset.shape}, {dataset.dtype}")
                else:
                    print(f"  /{name}: {item[()].tolist()}")
        print("posterior means (w, b), read back from the file:")
        means = []
        for chain, result in enumerate(results):
            w, b = result["samples"]["w"], result["samples"]["b"]
            means.append(np.append(w.mean(axis=0), b.mean()))
            count, began = int(result["sample_count"]), np.round(np.asarray(starts["w"][chain]), 1)
            print(f"  chain {chain}: {np.round(means[-1], 2)} from {count} samples (started at w = {began})")
        spread = np.ptp(np.array(means), axis=0).max()
        error = np.abs(np.mean(means, axis=0) - truth).max()
        print(f"  the chains agree to within {spread:.2f}; their mean is within {error:.2f} of the true parameters")
        if spread > 0.2 or error > 0.5:
            raise SystemExit("the sampler did not find the posterior")

        idata = io.to_inference_data(path)  # every chain, with chain and draw dimensions
        print(f"ArviZ: {dict(idata.posterior.sizes)}")
        print(az.summary(idata).to_string())
        az.plot_trace(idata, **({"compact": False} if az.__version__.startswith("0.") else {}))  # 1.x: no compact
        plt.tight_layout()
        os.makedirs(os.path.dirname(PLOT), exist_ok=True)
        plt.savefig(PLOT, dpi=80)
        print(f"trace plot written to {PLOT}")


if __name__ == "__main__":
    main()
