"""``jaxstow.io.no_save``: keep the samples of a jit-compiled run in device memory and return them."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow._util.arguments import checked_arguments
from jaxstow.errors import ArgumentError, SampleCountError
from jaxstow.io.batching import bytes_per_sample, conform, keep_flags, row_spec, spec_of, write_rows
from jaxstow.io.save_arguments import chains_marker, checked_information, checked_state, refuse_leafless
from jaxstow.io.saving import Saving
from jaxstow.io.scheduler import static_information as StaticInformation

__all__ = ["DeviceSamples", "no_save"]


class DeviceSamples(NamedTuple):
    """The saving state of :func:`no_save`: room for ``samples_collected`` samples on the device, and their count.

    Samples beyond the room are not stored; ``postprocess_save`` raises a :class:`~jaxstow.io.SampleCountError`
    if any of them was kept.
    """

    samples: Any
    sample_count: jax.Array
    #: ``(*chains, 2)``: ``[0, 1]`` for each chain. Where a ``vmap`` put the chains' axes, it put this array's too,
    #: and its values show it even where the room's length equals the number of chains, which shapes cannot.
    chains_marker: jax.Array

    @property
    def chains(self) -> tuple[int, ...]:
        """The shape of the chains: ``()`` for one chain, one axis per ``vmap`` that made or ran them."""
        return tuple(np.shape(self.sample_count))


def no_save() -> Saving:
    """Does not save the data on the host but returns it instead, as jax_sgmc's ``io.no_save`` does.

    The samples stay in device memory, whose size is fixed when the run is compiled, so
    ``static_information.samples_collected`` must be given. It is used as :func:`~jaxstow.io.save` is (see its
    example) and returns device arrays; donate the saving state to the run so that samples are written in place.
    A chain that fills its room exactly is returned as the state's own array, not copied (a copy would hold the
    samples twice on the device): give a later run a state of its own from ``init_save``, never the one returned.

    Returns:
        ``(init_save, save, postprocess_save)``, with the signatures of :func:`~jaxstow.io.save`'s.

    Raises:
        ArgumentError: ``init_save`` is not given ``samples_collected``, or is given a sample of no arrays.
        SampleCountError: ``postprocess_save`` finds more samples kept than ``samples_collected``.

    >>> import jax.numpy as jnp
    >>> from jaxstow import io, scheduler
    >>> init_save, save, postprocess_save = io.no_save()
    >>> state = init_save({'x': jnp.zeros(())}, None, scheduler.static_information(samples_collected=3))
    >>> state, _ = save(state, True, {'x': jnp.ones(())})
    >>> postprocess_save(state, None)['samples']
    {'x': Array([1.], dtype=float32)}
    """
    return _CHECKED


def _init(
    init_sample: Any, init_checkpoint: Any = None, static_information: StaticInformation | None = None
) -> DeviceSamples:
    """The empty device storage for ``samples_collected`` samples (``init_checkpoint`` is unused)."""
    del init_checkpoint
    capacity = checked_information(static_information).samples_collected
    if capacity is None or capacity < 1:
        raise ArgumentError(
            "no_save keeps the samples in device memory, whose size is fixed at compile time: give "
            "scheduler.static_information(samples_collected=N) with N >= 1, or stream them with "
            f"io.save(io.MemoryCollector()) (got samples_collected={capacity})"
        )
    spec = spec_of(init_sample)
    refuse_leafless(spec)
    try:
        samples = jax.tree.map(lambda leaf: jnp.zeros((capacity, *leaf.shape), leaf.dtype), spec)
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        raise ArgumentError(
            f"no_save's room for samples_collected={capacity} samples of {bytes_per_sample(spec)} bytes each is more than "
            "the device can hold: declare the samples each chain keeps, or stream them to the host, which holds more, "
            "with io.save(io.MemoryCollector())"
        ) from None
    return DeviceSamples(samples, jnp.zeros((), jnp.int32), chains_marker())


def _save(
    saving_state: DeviceSamples, keep: Any, sample: Any, scheduler_state: Any = None, solver_state: Any = None
) -> tuple[DeviceSamples, None]:
    """Store ``sample`` if ``keep`` (``scheduler_state`` and ``solver_state`` are unused)."""
    del scheduler_state, solver_state
    checked_state(saving_state, DeviceSamples, call="io.no_save's save")
    chain_ndim = np.ndim(saving_state.sample_count)
    sample = conform(sample, row_spec(saving_state.samples, chain_ndim), what="sample")
    capacity = jax.tree.leaves(saving_state.samples)[0].shape[chain_ndim]
    room = saving_state.sample_count < capacity
    last = (slice(None),) * chain_ndim + (capacity - 1,)

    def unless_full(new: jax.Array, stack: jax.Array) -> jax.Array:
        """Once the room is full, the last row takes its own value again: later samples must not replace it."""
        return jnp.where(room.reshape(room.shape + (1,) * (new.ndim - chain_ndim)), new, stack[last])

    sample = jax.tree.map(unless_full, sample, saving_state.samples)
    samples = write_rows(saving_state.samples, jnp.minimum(saving_state.sample_count, capacity - 1), sample)
    count = saving_state.sample_count + keep_flags(keep, np.shape(saving_state.sample_count)).astype(jnp.int32)
    return DeviceSamples(samples, count, saving_state.chains_marker), None


def _postprocess(saving_state: DeviceSamples, solver_state: Any = None) -> Any:
    """The kept samples per chain, as device arrays (``solver_state`` is unused)."""
    del solver_state
    checked_state(saving_state, DeviceSamples, call="io.no_save's postprocess_save")
    counts = np.asarray(saving_state.sample_count)
    capacity = jax.tree.leaves(saving_state.samples)[0].shape[counts.ndim]
    chains = list(np.ndindex(counts.shape))
    overflows = [
        (number, int(counts[index]), capacity) for number, index in enumerate(chains) if counts[index] > capacity
    ]
    if overflows:
        raise SampleCountError(
            overflows, f"no_save has room for {capacity} per chain on the device; declare the right number"
        )
    results = [
        {
            "sample_count": jnp.asarray(int(counts[index])),
            "samples": jax.tree.map(
                functools.partial(_kept, index=index, count=int(counts[index])), saving_state.samples
            ),
        }
        for index in chains
    ]
    return results[0] if counts.ndim == 0 else results


def _kept(leaf: jax.Array, *, index: tuple[int, ...], count: int) -> jax.Array:
    """The first ``count`` samples of the chain at ``index``, in one indexing operation (none if it is all of them)."""
    return leaf if not index and count == len(leaf) else leaf[(*index, slice(0, count))]


#: The three functions, whose calls are checked against their signatures (a misspelt keyword names what they take).
_CHECKED: Saving = (
    checked_arguments(_init, name="init_save"),
    checked_arguments(_save, name="save"),
    checked_arguments(_postprocess, name="postprocess_save"),
)
