"""Real blackjax and numpyro runs in real processes, killed with SIGKILL at random moments and started again.

Each sampler runs eight schools on 4 chains into an HDF5 file through its adapter. A process is started, killed at a
random moment after the run committed a new checkpoint, started again with the same call, and so on; the last one
finishes. The draws must then be bit for bit those of a run that was never interrupted, and the file must show no
trace of the kills. Meanwhile this process reads the file as the runs write it, in HDF5's SWMR mode, and checks
that what it reads is a prefix of the final draws (never a torn block). The processes come from a ``multiprocessing``
fork server that has already imported JAX, numpyro and jaxstow, and the uninterrupted run goes on beside
the killed ones.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import random
import signal
import time
from typing import Any

import numpy as np
import pytest
from xla_flags import FAST_COMPILE

import jaxstow.io.live
from jaxstow import io
from jaxstow.errors import JaxstowError

# Not imported here: importing blackjax starts JAX's backend, whose threads a forked process would lack.
if importlib.util.find_spec("blackjax") is None or importlib.util.find_spec("numpyro") is None:
    pytest.skip("needs blackjax and numpyro (pip install 'jaxstow[blackjax,numpyro]')", allow_module_level=True)

KILLS = 3
#: Samples drawn between checkpoints. A killed process makes one or two checkpoints before its kill, so the three kills
#: land in the first six segments of a run; the runs are twelve long, and what follows the kills runs uninterrupted.
SEGMENT = 125
Y = [28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0]
SIGMA = [15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]


def blackjax_run(path: str) -> dict[str, np.ndarray]:
    """NUTS with fixed parameters on eight schools (non-centred), 4 chains."""
    import blackjax
    import jax
    import jax.numpy as jnp
    from jax.scipy import stats

    def logdensity(p: dict[str, jax.Array]) -> jax.Array:  # tau ~ HalfCauchy(5) as log(tau); theta = mu + tau eta
        tau = jnp.exp(p["log_tau"])
        prior = stats.cauchy.logpdf(tau, 0, 5) + p["log_tau"] - p["mu"] ** 2 / 50 - jnp.sum(p["eta"] ** 2) / 2
        return prior + jnp.sum(stats.norm.logpdf(jnp.array(Y), p["mu"] + tau * p["eta"], jnp.array(SIGMA)))

    nuts = blackjax.nuts(logdensity, step_size=0.4, inverse_mass_matrix=jnp.ones(10))
    positions = {"mu": jnp.zeros(4), "log_tau": jnp.zeros(4), "eta": jnp.zeros((4, 8))}
    return io.blackjax.sample(
        path, nuts, positions, jax.random.key(7), num_samples=12 * SEGMENT, checkpoint_every=SEGMENT
    )


def numpyro_run(path: str) -> dict[str, np.ndarray]:
    """numpyro's HMC with step-size and mass-matrix adaptation on eight schools (centred), 4 chains."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import HMC, MCMC

    def model(sigma: jax.Array, y: jax.Array) -> None:
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("school", len(Y)):
            theta = numpyro.sample("theta", dist.Normal(mu, tau))
            numpyro.sample("y", dist.Normal(theta, sigma), obs=y)

    mcmc = MCMC(
        HMC(model, num_steps=8, trajectory_length=None),
        num_warmup=4 * SEGMENT,
        num_samples=8 * SEGMENT,
        num_chains=4,
        progress_bar=False,
    )
    return io.numpyro.run(
        mcmc, path, jax.random.key(3), model_args=(jnp.array(SIGMA), jnp.array(Y)), checkpoint_every=SEGMENT
    )


RUNS = {"blackjax": blackjax_run, "numpyro": numpyro_run}


#: Quicker to compile (each process compiles its sampler anew), and the same in every process, the uninterrupted one
#: included: the draws of one compiled program are compared.
def _run(kind: str, path: str) -> None:
    import jax

    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}"  # before JAX starts its backend
    # The sampler's compiled segments, kept for the processes after the first (the streaming part is compiled anew).
    jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.dirname(path), "jax-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    RUNS[kind](path)


@pytest.fixture(scope="module")
def processes() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["jax", "jax.numpy", "h5py", "numpyro", "jaxstow.io", __name__])
    return context


def _checkpoint_mark(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(f"{path}.checkpoint.jxs")
    except FileNotFoundError:
        return None
    return status.st_ino, status.st_mtime_ns


def _read_while_running(path: str, seen: list[Any]) -> None:
    """What a reader in another process gets now: the draws so far, kept to check against the final ones."""
    with contextlib.suppress(JaxstowError, OSError):  # no file yet, or its writer not yet in SWMR mode
        seen.append(jaxstow.io.live.read_draws(path))


def _follow(path: str, seen: list[Any], done: Any, process: Any = None) -> None:
    """Wait until ``done()``, reading the file now and then; ``process`` must not end meanwhile."""
    polls = 0
    while not done():
        assert process is None or process.is_alive(), "the run ended before it could be killed: give it more steps"
        if polls % 20 == 0:
            _read_while_running(path, seen)
        polls += 1
        time.sleep(0.005)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(RUNS))
def test_a_run_killed_at_random_moments_ends_with_the_draws_of_an_uninterrupted_run(kind, processes, tmp_path):
    uninterrupted = str(tmp_path / "uninterrupted.h5")
    reference = processes.Process(target=_run, args=(kind, uninterrupted))
    reference.start()
    # The killed runs start once the uninterrupted one has checkpointed: its sampler is compiled and cached by then,
    # so that no two processes compile it at once.
    _follow(uninterrupted, [], lambda: _checkpoint_mark(uninterrupted) is not None or not reference.is_alive())
    path = str(tmp_path / "killed.h5")
    moments = random.Random(kind)
    seen: list[Any] = []
    for _ in range(KILLS):
        process = processes.Process(target=_run, args=(kind, path))
        before = _checkpoint_mark(path)
        process.start()
        # Past its start (it has checkpointed anew), then at a random moment before its next checkpoint, or at that
        # checkpoint on a machine fast enough to reach it first: the kills come early in the run on any machine.
        _follow(path, seen, lambda before=before: _checkpoint_mark(path) not in (before, None), process)
        mark, deadline = _checkpoint_mark(path), time.monotonic() + moments.uniform(0.0, 0.1)
        _follow(path, seen, lambda m=mark, d=deadline: time.monotonic() >= d or _checkpoint_mark(path) != m, process)
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        assert process.exitcode == -signal.SIGKILL
    process = processes.Process(target=_run, args=(kind, path))
    process.start()
    _follow(path, seen, lambda process=process: not process.is_alive())
    assert process.exitcode == 0
    reference.join()
    assert reference.exitcode == 0

    expected = RUNS[kind](uninterrupted)  # finished: read from its file
    got = RUNS[kind](path)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert not os.path.exists(f"{path}.checkpoint.jxs") and not os.path.exists(f"{path}.lock")

    assert seen, "the file was never read while the run went on"
    for draws in seen:  # every read while the run went on: the same draws as at the end, up to what was written
        for chain, (variables, done) in enumerate(zip(draws.chains, draws.done, strict=True)):
            for name, values in variables.items():
                np.testing.assert_array_equal(values, got[name][chain, :done], err_msg=f"{name} of chain {chain}")
