"""blackjax samplers run over several chains inside ``jit``, their draws streamed to a resumable HDF5 file.

See :func:`jaxstow.io.run_chains` and docs/sampling-runs.md.

>>> import functools, os, tempfile, blackjax, jax, jax.numpy as jnp
>>> from jaxstow import io
>>> def logdensity(position):                     # a correlated normal in two dimensions
...     return -0.5 * (position["x"] ** 2 + (position["y"] - position["x"]) ** 2 / 0.1)
>>> path = os.path.join(tempfile.mkdtemp(), "normal.h5")
>>> draws = io.blackjax.sample(
...     path,
...     functools.partial(blackjax.nuts, logdensity),             # the algorithm, given the warm-up's parameters
...     {"x": jnp.zeros(4), "y": jnp.zeros(4)},                   # 4 chains
...     jax.random.key(0),
...     num_samples=200,
...     warmup=blackjax.window_adaptation(blackjax.nuts, logdensity),
...     num_warmup=100,
...     checkpoint_every=50,
... )
>>> draws["x"].shape
(4, 200)
>>> import h5py
>>> with h5py.File(path) as file:                 # the warm-up's results are kept with the run
...     file["warmup/step_size"].shape, file["warmup/inverse_mass_matrix"].shape
((4,), (4, 2))
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import PyTreeDef

from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError
from jaxstow.io.argument_digest import argument_digest
from jaxstow.io.code_digest import code_digest
from jaxstow.io.runs import run_chains

__all__ = ["sample"]


def sample(
    path: str | os.PathLike[str],
    algorithm: Any,
    positions: Any,
    key: jax.Array,
    *,
    num_samples: int,
    checkpoint_every: int = 1000,
    thin: int = 1,
    warmup: Any = None,
    num_warmup: int = 0,
    step_args: Callable[[jax.Array, jax.Array], tuple[Any, ...]] | None = None,
    draw: Callable[[Any, Any], Any] | None = None,
) -> dict[str, np.ndarray]:
    """Run a blackjax algorithm on every chain for ``num_samples`` steps, streaming every ``thin``-th draw to ``path``.

    Called again after a kill, the run continues from its last checkpoint (a kill during the warm-up runs the
    warm-up again), with draws bit for bit those of an uninterrupted run. See docs/sampling-runs.md.

    Args:
        path: The HDF5 file (see :func:`jaxstow.io.run_chains`).
        algorithm: A blackjax ``SamplingAlgorithm`` (``blackjax.nuts(logdensity, step_size, inverse_mass_matrix)``,
            ``blackjax.sgld(grad_estimator)``, ...), or, with ``warmup``, a function of the warm-up's parameters
            that returns one (``functools.partial(blackjax.nuts, logdensity)``).
        positions: The chains' initial positions, a pytree whose leaves have a leading axis of chains (else an
            ArgumentError).
        key: The run's PRNG key (typed or raw); the warm-up and each chain get keys split from it.
        num_samples: The steps after the warm-up.
        checkpoint_every: The steps between checkpoints.
        thin: Keep every ``thin``-th draw (an integer of at least 1, else an ArgumentError).
        warmup: A blackjax adaptation (``blackjax.window_adaptation(blackjax.nuts, logdensity)``), run on every
            chain for ``num_warmup`` steps; its parameters are kept in the file's ``/warmup`` group.
        num_warmup: The steps of the warm-up.
        step_args: ``step_args(key, t)``: more arguments of ``algorithm.step`` per chain at step ``t`` (for
            ``blackjax.sgld``: ``(minibatch, step_size)``).
        draw: ``draw(state, info)``: what each kept step stores (by default the state's ``position``, or the state).

    Returns:
        The draws, ``{name: array}`` shaped ``(chains, draws, ...)``.
    """
    require("h5py", extra="blackjax", purpose="jaxstow.io.blackjax.sample")  # before the run, which needs it to write
    if isinstance(thin, bool) or not isinstance(thin, int | np.integer) or thin < 1:
        raise ArgumentError(f"thin must be an integer of at least 1 (1 keeps every draw), got {thin!r}")
    for option, value in (("num_samples", num_samples), ("num_warmup", num_warmup)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise ArgumentError(f"{option} must be an integer of at least 0, got {value!r}")
    thin, num_samples, num_warmup = int(thin), int(num_samples), int(num_warmup)
    if not _is_algorithm(algorithm, made_by_warmup=warmup is not None):
        raise ArgumentError(
            f"algorithm must be a blackjax SamplingAlgorithm, such as blackjax.nuts(logdensity, step_size, "
            f"inverse_mass_matrix) (with warmup=: a function of the warm-up's parameters that gives one, such as "
            f"functools.partial(blackjax.nuts, logdensity)); got {type(algorithm).__name__}"
        )
    if not jnp.issubdtype(jnp.result_type(key), jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(jnp.asarray(key, jnp.uint32))  # a raw key of the default implementation
    impl = str(jax.random.key_impl(key))
    chains = _chain_count(positions)
    warm_key, chain_key = jax.random.split(key)
    chain_keys = jax.random.key_data(jax.random.split(chain_key, chains))  # carried as raw data: checkpointed

    def wrap(keys: jax.Array) -> jax.Array:
        wrapped: jax.Array = jax.random.wrap_key_data(keys, impl=impl)
        return wrapped

    def start() -> Any:
        if warmup is None:
            return jax.vmap(algorithm.init)(positions), {}, chain_keys

        def adapt(key: jax.Array, position: Any) -> Any:
            (state, parameters), _ = warmup.run(key, position, num_warmup)
            return state, {name: value for name, value in parameters.items() if isinstance(value, jax.Array)}

        states, parameters = jax.vmap(adapt)(jax.random.split(warm_key, chains), positions)
        return states, parameters, chain_keys

    def one_chain(state: Any, parameters: Any, key: jax.Array, t: jax.Array) -> tuple[Any, Any]:
        kernel = algorithm(**parameters) if warmup is not None else algorithm
        key, args_key = jax.random.split(wrap(key))
        out = kernel.step(key, state, *(step_args(args_key, t) if step_args is not None else ()))
        returned: PyTreeDef = jax.tree.structure(out)
        state, info = (out, None) if returned == jax.tree.structure(state) else out  # SG-MCMC returns the state
        if draw is not None:
            return state, draw(state, info)
        position = getattr(state, "position", state)
        return state, {"position": position} if isinstance(position, jax.Array) else position

    def step(state: Any, t: jax.Array) -> tuple[Any, Any, jax.Array]:
        states, parameters, keys = state
        keys, step_keys = jnp.moveaxis(jax.random.key_data(jax.vmap(jax.random.split)(wrap(keys))), 1, 0)
        states, draws = jax.vmap(one_chain, in_axes=(0, 0, 0, None))(states, parameters, step_keys, t)
        return (states, parameters, keys), draws, jnp.full((chains,), t % thin == 0)

    return run_chains(
        path,
        start,
        step,
        num_steps=num_samples,
        checkpoint_every=checkpoint_every,
        draws_per_chain=math.ceil(num_samples / thin),
        identity={
            "sampler": "blackjax",
            "key": np.asarray(jax.random.key_data(key)).tolist(),
            "key_impl": impl,
            "num_warmup": num_warmup if warmup is not None else 0,
            "num_samples": num_samples,
            "thin": thin,
            "arguments": argument_digest(positions),
            "algorithm_settings": argument_digest([_settings(algorithm), _settings(warmup)], depth=0),
            "step_settings": argument_digest([_settings(step_args), _settings(draw)], depth=0),
            "code": code_digest([algorithm, warmup, step_args, draw]),
        },
        warmup=(lambda state: state[1]) if warmup is not None else None,
    )


def _settings(made: Any, depth: int = 6) -> list[Any]:
    """The values (arrays, numbers, strings) ``made`` was made with: a partial's arguments, the values a blackjax
    algorithm's or adaptation's functions hold (``blackjax.nuts(f, step_size=0.1)``'s ``step`` holds its step size
    and mass matrix), and those of the functions they hold, ``depth`` levels down (a window adaptation's target
    acceptance rate, five down), so that a run continued with other settings is refused. Functions count by their
    names (the same in every process) and the values they hold.

    >>> import blackjax, functools, jax.numpy as jnp
    >>> mala = lambda step_size: blackjax.mala(lambda x: -jnp.sum(x**2), step_size=step_size)
    >>> 0.25 in _settings(mala(0.25)), _settings(mala(0.25)) == _settings(mala(0.5))
    (True, False)
    >>> "blackjax.mcmc.nuts.build_kernel" in _settings(functools.partial(blackjax.nuts, lambda x: x))
    True
    """
    found: list[Any] = []
    _collect(made, depth, found, set())
    return found


def _collect(made: Any, depth: int, found: list[Any], seen: set[int]) -> None:
    if made is None or id(made) in seen:
        return
    seen.add(id(made))
    if isinstance(made, functools.partial):
        values = [made.func, *made.args, made.keywords]
    elif inspect.isfunction(made):
        values = [contents for cell in made.__closure__ or () if (contents := _contents(cell)) is not None]
    else:  # an algorithm, an adaptation, or a maker of them (blackjax.nuts): the functions it holds
        values = [getattr(made, name, None) for name in _HELD]
    for leaf in (leaf for value in values for leaf in jax.tree.leaves(value)):
        if callable(leaf):  # by its name, the same in every process: nuts' kernel is not hmc's
            found.append(f"{getattr(leaf, '__module__', '')}.{getattr(leaf, '__qualname__', type(leaf).__qualname__)}")
            if depth > 0:
                _collect(leaf, depth - 1, found, seen)
        else:
            found.append(leaf)


#: The functions a blackjax algorithm (``init``, ``step``), adaptation (``run``) or maker of them holds.
_HELD = ("init", "step", "run", "build_kernel", "differentiable")


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return None


def _chain_count(positions: Any) -> int:
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in jax.tree.leaves(positions)}
    if len(sizes) != 1 or None in sizes:
        raise ArgumentError(
            "positions must be a pytree whose every leaf has the same leading axis, one entry per chain "
            f"(got leading sizes {sorted(map(str, sizes))})"
        )
    return int(sizes.pop())  # type: ignore[arg-type]


def _is_algorithm(algorithm: Any, *, made_by_warmup: bool) -> bool:
    """Whether ``algorithm`` is a blackjax algorithm (its ``init`` and ``step``), or a function of the warm-up's
    parameters that makes one."""
    if made_by_warmup:
        return callable(algorithm)
    return callable(getattr(algorithm, "init", None)) and callable(getattr(algorithm, "step", None))
