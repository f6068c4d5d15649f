"""A long sampling run killed and continued: blackjax NUTS on eight schools, 4 chains, every draw streamed to HDF5.

The run (Stan's window adaptation, then NUTS) goes through ``jaxstow.io.blackjax.sample``: each kept draw leaves the
jit-compiled loop for an HDF5 file, and the state of the chains (positions, keys, the warm-up's step sizes and mass
matrices, the step) is checkpointed with the draws every 100 steps. This demo

1. runs it once, uninterrupted, for reference;
2. starts it again in another process, into another file, reads that file while the run goes on (as
   ``jaxstow watch`` does), and kills the process with SIGKILL midway;
3. starts the same call again, which continues from the last checkpoint;
4. checks that the draws equal those of the uninterrupted run bit for bit, prints ArviZ's summary and writes a
   trace plot to ``examples/out/eight_schools_trace.png``.

JAX's persistent compilation cache keeps the compiled sampler for the processes after the first.

Run: python examples/demo_7_resumable_sampling.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy import stats

from jaxstow import io
from jaxstow.io.live import read_draws

CHAINS = 4
WARMUP = 500
SAMPLES = 4000
EVERY = 100
Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])  # the schools' estimated effects
SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])  # and their standard errors
PLOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "eight_schools_trace.png")


def logdensity(p: dict[str, jax.Array]) -> jax.Array:
    """The non-centred eight schools model: theta = mu + tau * eta, tau ~ HalfCauchy(5) sampled as log(tau)."""
    tau = jnp.exp(p["log_tau"])
    theta = p["mu"] + tau * p["eta"]
    prior = stats.norm.logpdf(p["mu"], 0.0, 5.0) + stats.cauchy.logpdf(tau, 0.0, 5.0) + p["log_tau"]
    return prior + stats.norm.logpdf(p["eta"]).sum() + stats.norm.logpdf(Y, theta, SIGMA).sum()


def kept(state, info):
    """What each draw stores: the model's parameters (mu, tau, theta), not the sampler's coordinates."""
    p = state.position
    tau = jnp.exp(p["log_tau"])
    return {"mu": p["mu"], "tau": tau, "theta": p["mu"] + tau * p["eta"]}


def sample(path: str) -> dict[str, np.ndarray]:
    import functools

    import blackjax

    jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.dirname(path), "jax-cache"))
    starts = jax.random.normal(jax.random.key(1), (CHAINS, 10))
    positions = {"mu": starts[:, 0], "log_tau": starts[:, 1], "eta": starts[:, 2:]}
    return io.blackjax.sample(
        path,
        functools.partial(blackjax.nuts, logdensity),
        positions,
        jax.random.key(0),
        num_samples=SAMPLES,
        warmup=blackjax.window_adaptation(blackjax.nuts, logdensity),
        num_warmup=WARMUP,
        checkpoint_every=EVERY,
        draw=kept,
    )


def main() -> None:
    folder = tempfile.mkdtemp()
    reference, path = os.path.join(folder, "uninterrupted.h5"), os.path.join(folder, "eight_schools.h5")
    print(f"eight schools, blackjax NUTS: {CHAINS} chains, {WARMUP} warm-up steps, {SAMPLES} draws each")
    start = time.perf_counter()
    expected = sample(reference)
    print(f"1. uninterrupted run into {reference}: {time.perf_counter() - start:.1f} s, compilation included")

    run = [sys.executable, __file__, "--run", path]
    process = subprocess.Popen(run)
    print(f"2. the same run in process {process.pid}, into {path}; read while it goes on:")
    while True:
        try:
            draws = read_draws(path)  # what `jaxstow watch` reads, from this process
        except (OSError, ValueError):  # no file yet, or its chains not yet registered
            draws = None
        if draws is not None and min(draws.done) >= SAMPLES // 3:
            break
        if draws is not None and min(draws.done):
            mu = np.concatenate([chain["mu"] for chain in draws.chains])
            print(f"   draws per chain so far: {draws.done}, mean of mu so far {mu.mean():.2f}")
        if process.poll() is not None:
            raise SystemExit("the run ended before it could be killed")
        time.sleep(0.3)
    process.send_signal(signal.SIGKILL)
    process.wait()
    left = read_draws(path).done
    print(f"   killed with SIGKILL after {left} draws per chain; left: {sorted(os.listdir(folder))}")

    start = time.perf_counter()
    subprocess.run(run, check=True)
    print(f"3. the same call again continued from its last checkpoint: {time.perf_counter() - start:.1f} s")

    got = sample(path)  # finished: read from the file, not run again
    for name in expected:
        if got[name].shape != expected[name].shape or not np.array_equal(got[name], expected[name]):
            raise SystemExit(f"the resumed run's {name} differs from the uninterrupted run's")
    print(f"4. the draws equal those of the uninterrupted run bit for bit: { ({k: v.shape for k, v in got.items()}) }")

    warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")  # ArviZ announces its 1.0 refactor
    import arviz as az
    import h5py
    import matplotlib

    matplotlib.use("Agg")  # draws to files, with no display needed
    import matplotlib.pyplot as plt

    with h5py.File(path, "r") as file:
        print(f"   warm-up's step sizes, kept with the run: {np.round(file['warmup/step_size'][:], 3)}")
    idata = io.to_inference_data(path)
    print(az.summary(idata, round_to=2).to_string())
    az.plot_trace(idata, **({"compact": True} if az.__version__.startswith("0.") else {}))  # 1.x: no compact
    plt.tight_layout()
    os.makedirs(os.path.dirname(PLOT), exist_ok=True)
    plt.savefig(PLOT, dpi=72, metadata={"Software": None})
    print(f"trace plot written to {PLOT}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        sample(sys.argv[2])
    else:
        main()
