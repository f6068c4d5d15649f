"""The arguments of :func:`jaxstow.io.save` and of the ``init_save`` it returns, checked where they are given: a
mistake is an :class:`~jaxstow.errors.ArgumentError` that names it, not Python's or jax's error from inside a run.

>>> from jaxstow import io
>>> from jaxstow.io.save_arguments import checked_collector
>>> checked_collector("samples.h5")
Traceback (most recent call last):
...
jaxstow.errors.ArgumentError: data_collector must be a collector, io.MemoryCollector() or io.HDF5Collector(path), not 'samples.h5': io.HDF5Collector('samples.h5') writes to that file
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow.errors import ArgumentError, excerpt
from jaxstow.io.collector import DataCollector
from jaxstow.io.scheduler import static_information as StaticInformation

__all__ = ["checked_collector", "checked_information", "checked_steps", "is_key", "refuse_keys", "refuse_leafless"]


def checked_collector(collector: Any) -> DataCollector:
    """``data_collector=``: an instance with the methods of a :class:`~jaxstow.io.DataCollector`."""
    if isinstance(collector, type):
        raise ArgumentError(
            f"data_collector is the class {collector.__name__}: pass an instance, io.save({collector.__name__}(...))"
        )
    if not callable(getattr(collector, "register_chain", None)):
        hint = f": io.HDF5Collector({collector!r}) writes to that file" if isinstance(collector, str) else ""
        raise ArgumentError(
            "data_collector must be a collector, io.MemoryCollector() or io.HDF5Collector(path), not "
            f"{excerpt(collector)}{hint}"
        )
    checked: DataCollector = collector
    return checked


def checked_steps(name: str, value: Any, *, least: int, meaning: str) -> None:
    """A count of ``name=``: an integer from ``least`` on (``meaning`` says what it counts)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
        raise ArgumentError(f"{name} must be {meaning}, got {excerpt(value)}")


def checked_information(information: Any) -> StaticInformation:
    """``init_save``'s ``static_information``: ``scheduler.static_information(...)``, or ``None`` for its defaults."""
    if information is None:
        return StaticInformation()
    if not hasattr(information, "samples_collected"):  # jax_sgmc's own tuple of the same fields too
        raise ArgumentError(
            "static_information must be scheduler.static_information(samples_collected=...), not "
            f"{excerpt(information)}"
        )
    return StaticInformation(information.samples_collected)  # checked, as a tuple of jax_sgmc's or _replace left it


def refuse_leafless(spec: Any) -> None:
    """Refuse a sample of no arrays (``{}``, ``None``): there is nothing to save of it."""
    if not jax.tree.leaves(spec):
        raise ArgumentError(
            f"init_save's sample must hold at least one array, got {spec!r}, a tree of none: save the values to "
            "keep, e.g. {'x': x}, or count the kept steps without io.save"
        )


def refuse_keys(spec: Any) -> None:
    """Refuse a sample with a typed PRNG key, which the buffer of samples cannot hold: its data can be saved."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(spec)[0]:
        if is_key(leaf):
            raise ArgumentError(
                f"init_save's sample holds a typed PRNG key at {jax.tree_util.keystr(path)}: save its data, "
                "jax.random.key_data(key), and rebuild the key with jax.random.wrap_key_data"
            )


def is_key(leaf: Any) -> bool:
    """Whether ``leaf`` is a typed PRNG key (or a tree spec of one)."""
    return bool(jnp.issubdtype(jnp.result_type(leaf), jax.dtypes.prng_key))


def checked_state(state: Any, kind: type, *, call: str) -> None:
    """Refuse a saving state that is not of ``kind`` (another strategy's), one whose arrays lack its ``chains`` as
    their leading axes, or, for ``postprocess_save``, one traced or one whose arrays are gone (donated to the run that
    it started).

    >>> checked_state((), tuple, call="save")
    >>> checked_state({}, tuple, call="io.no_save's save")
    Traceback (most recent call last):
    ...
    jaxstow.errors.ArgumentError: io.no_save's save needs the saving state its own init_save returned (a tuple), got a dict: a state of another strategy cannot go on in this one
    """
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], kind) and state[1] is None:
        raise ArgumentError(
            f"{call} was given what save returns, (saving_state, None), not the saving state: take its first element, "
            "saving_state, _ = save(saving_state, keep, sample)"
        )
    if not isinstance(state, kind):
        raise ArgumentError(
            f"{call} needs the saving state its own init_save returned (a {kind.__name__}), got a "
            f"{type(state).__name__}: a state of another strategy cannot go on in this one"
        )
    if "postprocess_save" in call and any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(state)):
        raise ArgumentError(
            f"{call} was called inside jax.jit (or vmap, scan): it hands the run's samples over on the "
            "host, so call it outside, with the saving state the jitted run returns"
        )
    if "postprocess_save" in call and any(
        isinstance(leaf, jax.Array) and leaf.is_deleted() for leaf in jax.tree.leaves(state)
    ):
        raise ArgumentError(
            f"{call} was given a saving state whose arrays are gone: donated to a run (donate_argnums), or deleted. "
            "Give it the state the run returned (final = run(state); postprocess_save(final, None))"
        )
    _refuse_moved_chains(state, call)


def chains_marker() -> jax.Array:
    """A chain's ``[0, 1]``, kept in a saving state: stacked by ``vmap``, its values show where the chains' axes
    went, even where every shape of the state would fit either way (see :func:`checked_state`)."""
    return jnp.arange(2, dtype=jnp.int8)


def _refuse_moved_chains(state: Any, call: str) -> None:
    """Refuse a state (with the ``chains`` shape of its chains) whose arrays do not all start with its chains' axes:
    a ``vmap`` with ``out_axes`` other than 0 moved them, and each chain would be read along another axis; or one
    whose ``chain_fields`` lack them or have more (a ``vmap`` that mapped a part of the state only)."""
    chains = getattr(state, "chains", None)
    if chains is None:
        return
    for name, axes in getattr(state, "chain_fields", {}).items():
        if len(shape := np.shape(getattr(state, name))) != len(chains) + axes:  # out_axes keeps the axes, moved
            raise ArgumentError(
                f"{call} was given a saving state whose {name} is shaped {shape}, where its chains are {chains}: a "
                "jax.vmap mapped some of its arrays and not others (in_axes=None for a part of it), so that they no "
                "longer tell each chain's own apart; map the whole state with the chains, in_axes=0 for all of it"
            )
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if tuple(np.shape(leaf)[: len(chains)]) != chains:
            _refuse_moved(call, chains, f"its leaf {jax.tree_util.keystr(path)} is shaped {tuple(np.shape(leaf))}")
    marker = getattr(state, "chains_marker", None)
    if isinstance(marker, jax.core.Tracer) or marker is None:
        return
    if np.shape(marker) != (*chains, 2) or not np.array_equal(marker, np.broadcast_to(np.arange(2), (*chains, 2))):
        _refuse_moved(call, chains, "its arrays' axes were moved (its chains_marker shows it)")


def _refuse_moved(call: str, chains: tuple[int, ...], evidence: str) -> None:
    raise ArgumentError(
        f"{call} was given a saving state whose chains, of the shape {chains}, do not lead its arrays: {evidence}, "
        "as a jax.vmap with out_axes other than 0 leaves it. Return the saving state with out_axes=0 (the default), "
        "or move the axes back with jnp.moveaxis before passing it on"
    )
