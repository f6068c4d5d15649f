"""The steps of ``jaxstow.io.save`` inside a compiled run: a sample written into its chain's ring, and full blocks
(with the checkpoints) sent to the host.

A :class:`ChainSteps` is all that a run's compiled program holds of its strategy: JAX keeps the batching rule of each
step with the traced program, in caches that outlive the run, so it holds no collector (nor the samples of a run that
stopped before its ``postprocess_save``). Its callbacks reach the host of the strategy whose number the saving state
carries (:func:`~jaxstow.io.receiving.routed`).

>>> import jax.numpy as jnp
>>> from jaxstow.io.chain_steps import ChainSteps, Moving
>>> counts = jnp.zeros((1, 5), jnp.int32)  # one chain: strategy, id, sent, rows filled, next row
>>> moved = ChainSteps(0).step(Moving({"x": jnp.zeros((1, 4))}, counts, jnp.zeros(1, jnp.int32), None),
...                            jnp.ones(1, bool), {"x": jnp.ones(1)}, None)
>>> moved.buffer["x"][0].tolist(), moved.counts[0].tolist()
([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 1, 1])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxstow._util import jax_compat
from jaxstow.io.batching import write_rows
from jaxstow.io.host_block import send_block
from jaxstow.io.receiving import routed

__all__ = ["ChainSteps", "Moving"]


def _count(counts: jax.Array, kept: jax.Array) -> jax.Array:
    """The counts after a sample: a row filled and the next row, where kept."""
    return counts.at[..., 3:].add(kept[..., None])


class Moving(NamedTuple):
    """The fields of a :class:`SavingState` that a step of ``save`` may change (``step`` only with checkpoints)."""

    buffer: Any
    counts: jax.Array
    full: jax.Array
    step: jax.Array | None


class ChainSteps:
    """The steps of the runs of one strategy, which checkpoint every ``checkpoint_every`` steps (0: never)."""

    def __init__(self, checkpoint_every: int) -> None:
        self.checkpoint_every = checkpoint_every

    def step(self, state: Moving, keep: jax.Array, sample: Any, checkpoint: Any) -> Moving:
        # None of it starts before the sample is computed: work of a step that XLA's CPU runtime may run beside the
        # sampler's keeps a second thread of its pool awake, spinning between steps (twice the process's CPU time).
        kept = keep.astype(jnp.int32)  # before the barrier: a constant stays one, computed at no step
        state, kept, sample, checkpoint = jax.lax.optimization_barrier((state, kept, sample, checkpoint))  # type: ignore[no-untyped-call]
        ring = jax.tree.leaves(state.buffer)[0].shape[kept.ndim]
        buffer = write_rows(state.buffer, jax.lax.rem(state.counts[..., 4], jnp.int32(ring)), sample)
        if checkpoint is None or state.step is None:
            return self._blocks_step(state._replace(buffer=buffer), kept, ring // 2)
        return self._checkpoint_step(state._replace(buffer=buffer), state.step + 1, kept, ring // 2, checkpoint)

    def _checkpoint_step(self, state: Moving, step: jax.Array, kept: jax.Array, rows: int, checkpoint: Any) -> Moving:
        """A step with checkpoints, its sample written. A full block goes at the call after the one that filled it,
        without that call's sample, as without checkpoints; a checkpoint carries the rows of the block so far, this
        call's sample included, and leaves them in the block, whose next sending holds them again. Both branches of a
        ``lax.cond`` that ``vmap`` runs for every chain send checkpoints, each with its branch's sample for every
        chain: the host keeps the last, and the block sent later, from the state that each chain kept, puts right the
        rows of the chains that took the other branch (``step`` counts this call)."""
        due = jnp.any(step % self.checkpoint_every == 0).astype(jnp.int32)
        full = state.full if state.full.ndim == 0 else jnp.any(state.full).astype(jnp.int32)

        def count(counts: jax.Array, buffer: Any, *_: Any) -> jax.Array:
            return _count(counts, kept)

        def send(counts: jax.Array, buffer: Any, *_: Any) -> jax.Array:
            return _count(self._send(counts, buffer), kept)

        def take(counts: jax.Array, buffer: Any, *taken: Any) -> jax.Array:
            return self._take_checkpoint(count(counts, buffer), buffer, taken)

        def send_and_take(counts: jax.Array, buffer: Any, *taken: Any) -> jax.Array:
            return self._take_checkpoint(send(counts, buffer), buffer, taken)

        counts = jax_compat.switch_in_range(
            full + 2 * due, [count, send, take, send_and_take], state.counts, state.buffer, step, *checkpoint
        )
        return Moving(state.buffer, counts, (counts[..., 3] == rows).astype(jnp.int32), step)

    def _blocks_step(self, state: Moving, kept: jax.Array, rows: int) -> Moving:
        """A step without checkpoints, its sample written. Every operation here runs at every step, and XLA's CPU
        runtime runs a loop's body one operation after the other only while it holds at most 8 of them (else it
        schedules them on its pool at every step): whether this call sends is known since the call before
        (``state.full``: a block of ``rows`` is full), so the step tests nothing, and the counts change as one array.
        """

        def wait(counts: jax.Array, kept: jax.Array, buffer: Any) -> tuple[jax.Array, jax.Array]:
            counts = _count(counts, kept)
            return counts, (counts[..., 3] == rows).astype(jnp.int32)

        def send(counts: jax.Array, kept: jax.Array, buffer: Any) -> tuple[jax.Array, jax.Array]:
            # The blocks go without this call's sample, which starts the next one (a block of rows or one short).
            return wait(self._send(counts, buffer), kept, buffer)

        index = state.full if state.full.ndim == 0 else jnp.any(state.full).astype(jnp.int32)
        counts, full = jax_compat.switch_in_range(index, [wait, send], state.counts, kept, state.buffer)
        return Moving(state.buffer, counts, full, state.step)

    def _send(self, counts: jax.Array, buffer: Any) -> jax.Array:
        """Send every chain's block; the counts after it, the block's rows sent."""
        # The numbers go as one small array: each argument of a callback costs its own transfer to the host.
        numbers = jnp.moveaxis(counts, -1, 0)
        # Delivering a block twice stores the same rows twice, so it needs no side-effect machinery, which costs every
        # step of the loop whether a block is sent or not; the token orders the deliveries.
        token = send_block(routed("receive_block", self.checkpoint_every), numbers, jax.tree.leaves(buffer), owner=self)
        ring = jax.tree.leaves(buffer)[0].shape[numbers.ndim - 1]
        zero = jnp.zeros_like(token)
        return jnp.stack(
            [numbers[0], token, numbers[2] + numbers[3], zero, jax.lax.rem(numbers[4], jnp.int32(ring))], axis=-1
        )

    def _take_checkpoint(self, counts: jax.Array, buffer: Any, checkpoint: tuple[Any, ...]) -> jax.Array:
        """Send every chain's checkpoint, with the rows of its block so far, which stay in the block; the counts
        after it."""
        # A checkpoint must be taken exactly once, in order: a side effect. The layout goes with this program's
        # callback: another program of the strategy has one of its own.
        leaves, layout = jax.tree.flatten((buffer, checkpoint))
        numbers = jnp.moveaxis(counts, -1, 0)
        routine = routed("receive_checkpoint", self.checkpoint_every, layout)
        token = send_block(routine, numbers, leaves, side_effect=True, owner=self)
        return counts.at[..., 1].set(token)
