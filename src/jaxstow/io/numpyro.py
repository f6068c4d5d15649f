"""numpyro's MCMC run with its kernel stepped inside ``jit``, its draws streamed to a resumable HDF5 file.

See :func:`jaxstow.io.run_chains` and docs/sampling-runs.md.

>>> import os, tempfile, jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
>>> from numpyro.infer import MCMC, NUTS
>>> from jaxstow import io
>>> def model(y):
...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
...     sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
...     numpyro.deterministic("precision", 1 / sigma**2)
...     numpyro.sample("y", dist.Normal(mu, sigma), obs=y)
>>> mcmc = MCMC(NUTS(model), num_warmup=100, num_samples=100, num_chains=2, chain_method="vectorized",
...             progress_bar=False)
>>> path = os.path.join(tempfile.mkdtemp(), "normal.h5")
>>> draws = io.numpyro.run(mcmc, path, jax.random.key(0), model_args=(jnp.array([1.2, 0.8, 1.1, 0.9]),))
>>> sorted(draws), draws["mu"].shape                # numpyro's sites, deterministic ones included
(['mu', 'precision', 'sigma'], (2, 100))
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow._format.leaves import key_impl_name
from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError
from jaxstow.io.argument_digest import argument_digest
from jaxstow.io.code_digest import code_digest
from jaxstow.io.runs import run_chains

__all__ = ["run"]


def run(
    mcmc: Any,
    path: str | os.PathLike[str],
    rng_key: jax.Array,
    *,
    model_args: tuple[Any, ...] = (),
    model_kwargs: Mapping[str, Any] | None = None,
    init_params: Any = None,
    checkpoint_every: int = 1000,
) -> dict[str, np.ndarray]:
    """Run ``mcmc`` as ``mcmc.run(rng_key, *model_args, **model_kwargs)`` would, streaming its draws to ``path``.

    The chains run vectorized (``vmap``), one kernel ``sample`` per step inside a jit-compiled ``lax.scan``; the
    kernel's whole state is checkpointed, warm-up included, and the step size and inverse mass matrix the warm-up
    ends with are kept in the file's ``/warmup`` group. Called again after a kill, the run continues from its last
    checkpoint, with draws bit for bit those of an uninterrupted run. See docs/sampling-runs.md.

    Args:
        mcmc: A ``numpyro.infer.MCMC``: its kernel (``NUTS`` or ``HMC``),
            ``num_warmup``, ``num_samples``, ``num_chains`` and ``thinning`` are used.
        path: The HDF5 file (see :func:`jaxstow.io.run_chains`).
        rng_key: The run's PRNG key.
        model_args: The model's positional arguments.
        model_kwargs: The model's keyword arguments.
        init_params: Initial parameters, as ``mcmc.run`` takes them.
        checkpoint_every: The steps between checkpoints.

    Returns:
        The constrained values of the model's sites and deterministic sites, ``{site: (chains, draws, ...)}``: the
        draws ``mcmc.run`` keeps (with ``thinning``, ``num_samples // thinning`` of them, the last draw included).
        Sites keep numpyro's names; in the file, a ``/`` in one (``numpyro.handlers.scope``'s) is ``%2F``.
    """
    require("h5py", extra="numpyro", purpose="jaxstow.io.numpyro.run")  # before the run, which needs it to write
    hmc = require("numpyro.infer", extra="numpyro", purpose="jaxstow.io.numpyro.run").HMC
    if not isinstance(mcmc.sampler, hmc):  # NUTS too; the draws of other kernels would not be mcmc.run's
        name = type(mcmc.sampler).__name__
        raise ArgumentError(
            f"io.numpyro.run runs numpyro's HMC and NUTS kernels, whose draws it gives as mcmc.run does, not {name}: "
            f"run {name} with mcmc.run"
        )
    kernel = copy.copy(mcmc.sampler)  # initialized here: numpyro vectorizes a kernel's step at each init of it
    num_warmup, num_samples, chains, thinning = mcmc.num_warmup, mcmc.num_samples, mcmc.num_chains, mcmc.thinning
    kwargs = dict(model_kwargs or {})
    if jnp.issubdtype(jnp.result_type(rng_key), jax.dtypes.prng_key):
        if (impl := key_impl_name(jnp.result_type(rng_key))) != "threefry2x32":
            raise ArgumentError(
                f"io.numpyro.run takes a threefry2x32 key (jax.random.key(seed)), not one of {impl}: numpyro's "
                "kernel state holds its keys as raw data, which this run could not checkpoint as keys of another kind"
            )
        rng_key = jax.random.key_data(rng_key)
    raw = jnp.asarray(rng_key, jnp.uint32)
    keys = jax.random.split(raw, chains) if chains > 1 else raw[None]  # as mcmc.run splits them: one chain, not
    initial = jax.jit(lambda keys: kernel.init(keys, num_warmup, init_params, model_args, kwargs))(
        keys
    )  # vectorized; traced and compiled as one program rather than op by op
    constrain = jax.vmap(kernel.postprocess_fn(model_args, kwargs))

    kept = num_samples // thinning * thinning  # numpyro's fori_collect keeps the last of every thinning draws

    def step(state: Any, t: jax.Array) -> tuple[Any, Any, jax.Array]:
        state = kernel.sample(state, model_args, kwargs)
        before_end = num_warmup + num_samples - 1 - t  # the draws after this one
        keep = (before_end < kept) & (before_end % thinning == 0)
        draws = {_stored(site): value for site, value in constrain(state.z).items()}
        return state, draws, jnp.full((chains,), keep)

    def warmup(state: Any) -> dict[str, jax.Array]:
        adapted = state.adapt_state
        matrices = adapted.inverse_mass_matrix
        if not isinstance(matrices, Mapping):  # a model given as a potential function: one matrix
            matrices = {("z",): matrices}
        return {
            "step_size": adapted.step_size,
            **{f"inverse_mass_matrix/{','.join(sites)}": matrix for sites, matrix in matrices.items()},
        }

    draws = run_chains(
        path,
        lambda: initial,
        step,
        num_steps=num_warmup + num_samples,
        checkpoint_every=checkpoint_every,
        draws_per_chain=num_samples // thinning,
        identity={
            "sampler": f"numpyro.{type(kernel).__name__}",
            "settings": _settings(kernel),
            "code": code_digest(getattr(kernel, "model", None)),
            "key": np.asarray(raw).tolist(),
            "num_warmup": num_warmup,
            "num_samples": num_samples,
            "thinning": thinning,
            "arguments": argument_digest((model_args, kwargs, init_params)),
        },
        warmup=warmup,
        warmup_steps=num_warmup,
    )
    return {_site(name): values for name, values in draws.items()}


def _settings(kernel: Any) -> dict[str, Any]:
    """The kernel's settings that change its draws (``target_accept_prob``, ``max_tree_depth``, ``dense_mass``, ...,
    and the initialization strategy), as numpyro's kernels keep them: a run goes on only with the same.

    >>> from numpyro.infer import NUTS
    >>> settings = _settings(NUTS(lambda: None, max_tree_depth=3))
    >>> settings["max_tree_depth"], settings["target_accept_prob"], settings["init_strategy"]
    (3, 0.8, 'numpyro.infer.initialization.init_to_uniform')
    """
    settings = {
        name.lstrip("_"): value
        for name, value in sorted(vars(kernel).items())
        if isinstance(value, bool | int | float | str)
    }
    strategy = getattr(kernel, "_init_strategy", None)
    if isinstance(strategy, functools.partial):
        keywords = ", ".join(f"{name}={value!r}" for name, value in sorted(strategy.keywords.items()))
        settings["init_strategy"] = f"{strategy.func.__module__}.{strategy.func.__qualname__}({keywords})"
    elif callable(strategy):
        settings["init_strategy"] = f"{getattr(strategy, '__module__', '')}.{getattr(strategy, '__qualname__', '')}"
    return settings


def _stored(site: str) -> str:
    """A site's name as the file names its dataset: a ``/`` (``numpyro.handlers.scope``'s) would make it a group."""
    return site.replace("%", "%25").replace("/", "%2F")


def _site(name: str) -> str:
    """The site a dataset of the file holds (:func:`_stored`'s inverse)."""
    return name.replace("%2F", "/").replace("%25", "%")
