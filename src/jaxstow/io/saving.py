"""``jaxstow.io.save``: stream the samples of a jit-compiled run to a data collector on the host, in blocks.

The saving state carries a device buffer of ``block_size`` samples per chain. ``save`` writes each sample into it
(counting it only if ``keep`` is true); when a chain's buffer is full, every chain's buffered samples go to the
host in one host callback that also carries each chain's id and the index of its block's first sample, so the
collector can place blocks that arrive in any order (or twice: a block lands at its own rows). That makes delivering
blocks free of side effects, so it is a callback like ``pure_callback`` (:mod:`jaxstow.io.host_block`, which spares
the block a copy), costing nothing at the steps that send no block; an ``io_callback``, whose side-effect machinery
runs at every step, is used only with checkpoints. Every
``checkpoint_every`` steps the buffers are sent along with the solver state, which the collector checkpoints.

The callback only queues what it received: a thread of the strategy's own hands the blocks (and checkpoints) to the
collector, in order, while the jit-compiled run goes on, so the collector's copying or writing never holds the run
up. ``postprocess_save`` waits for that thread, sends the rest and waits for the collector; an error inside the
collector surfaces there, with its cause.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.tree_util import PyTreeDef

from jaxstow._util import jax_compat
from jaxstow.errors import ArgumentError, CollectorError, SampleCountError, failed
from jaxstow.io.batching import (
    block_rows,
    chain_polymorphic,
    conform,
    keep_flags,
    row_spec,
    shared_chains,
    shared_state_error,
    spec_of,
    token_spec,
    write_rows,
)
from jaxstow.io.collector import ChainCheckpoint, DataCollector
from jaxstow.io.host_block import send_block
from jaxstow.io.job_queue import JobQueue
from jaxstow.io.memory import MemoryCollector
from jaxstow.io.scheduler import static_information as StaticInformation

__all__ = ["Saving", "SavingState", "save"]

#: At most this many rows in a chain's device buffer when ``block_size`` is not given (see ``batching.block_rows``).
_MAX_BLOCK = 1 << 16
#: At most this many callbacks' blocks wait for the collector; a callback beyond them waits until one is delivered.
_PENDING_DELIVERIES = 4

InitSave = Callable[..., Any]
Save = Callable[..., tuple[Any, None]]
PostprocessSave = Callable[..., Any]
Saving = tuple[InitSave, Save, PostprocessSave]


class SavingState(NamedTuple):
    """The device side of :func:`save` for one chain (or, stacked, for several).

    Every field has the chains' shape, except ``buffer``: the sample's structure with leaves
    ``(*chains, block_size, *leaf)``.
    """

    chain_id: jax.Array
    buffer: Any
    sent: jax.Array  # samples kept and sent to the host since the start of the run
    fill: jax.Array  # samples kept since then, in the first rows of the buffer
    step: jax.Array  # calls of save since the start of the run (counted only with checkpoints)
    token: jax.Array  # the chain's id, as the host's last answer: orders the callbacks and names the chain to the host

    @property
    def sample_count(self) -> jax.Array:
        """The samples kept since the start of the run."""
        return self.sent + self.fill


def save(
    data_collector: DataCollector | None = None, checkpoint_every: int = 0, *, block_size: int | None = None
) -> Saving:
    """Initializes asynchronous saving of samples and checkpoints, as jax_sgmc's ``io.save`` does.

    Kept samples reach ``data_collector`` on the host in blocks, while the run goes on. See docs/sampling.md.

    Args:
        data_collector: Where the samples go (a :class:`~jaxstow.io.MemoryCollector` by default).
        checkpoint_every: Checkpoint ``solver_state`` and ``scheduler_state`` every ``n`` calls of ``save`` (0: never).
        block_size: Samples per chain buffered on the device (by default a power of two, at most 1 MiB).

    Returns:
        ``(init_save, save, postprocess_save)``: ``init_save(init_sample, init_checkpoint, static_information)``
        registers a chain (under ``jax.vmap``, one per element it maps, each with a state of its own);
        ``save(saving_state, keep, sample, scheduler_state=None, solver_state=None)`` runs inside jit;
        ``postprocess_save(saving_state, solver_state)`` returns the samples.

    Raises:
        ArgumentError: A negative ``checkpoint_every`` or a ``block_size`` below 1.

    >>> import jax, jax.numpy as jnp
    >>> from jaxstow import io, scheduler
    >>> init_save, save, postprocess_save = io.save(io.MemoryCollector())
    >>> state = init_save({'iteration': jnp.array(0)}, {}, scheduler.static_information(samples_collected=3))
    >>> state, _ = jax.lax.scan(lambda s, it: save(s, it % 2 == 0, {'iteration': it}), state, jnp.arange(5))
    >>> print(postprocess_save(state, None))
    {'sample_count': Array(3, dtype=int32, weak_type=True), 'samples': {'iteration': array([0, 2, 4], dtype=int32)}}
    """
    if checkpoint_every < 0:
        raise ArgumentError(f"checkpoint_every must be 0 (never) or a number of steps, got {checkpoint_every}")
    if block_size is not None and block_size < 1:
        raise ArgumentError(f"block_size must be at least 1, got {block_size}")
    streaming = _Streaming(
        MemoryCollector() if data_collector is None else data_collector, checkpoint_every, block_size
    )
    return streaming.init, streaming.save, streaming.postprocess


class _Moving(NamedTuple):
    """The fields of a :class:`SavingState` that a step of ``save`` may change (``step`` only with checkpoints)."""

    buffer: Any
    sent: jax.Array
    fill: jax.Array
    token: jax.Array
    step: jax.Array | None


def _sample_bytes(spec: Any) -> int:
    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(spec))


def _is_key(leaf: Any) -> bool:
    return bool(jnp.issubdtype(jnp.result_type(leaf), jax.dtypes.prng_key))


def _weakly(method: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """``method`` as a host callback that does not keep its strategy alive.

    JAX holds a compiled program's callbacks in reference cycles, which only the garbage collector frees: a strategy
    (and its collector's storage) held by them would outlive the run until it ran. The caller holds the strategy
    while it runs the program, through ``save`` and ``postprocess_save``.
    """
    reference = weakref.WeakMethod(method)

    def call(*arrays: Any) -> np.ndarray:
        bound = reference()
        if bound is None:
            raise CollectorError("the saving strategy of this run is gone: keep io.save's functions while it runs")
        return bound(*arrays)

    return call


class _Streaming:
    """One saving strategy: the collector, its chains' declared sample counts, and the failures met on the host."""

    def __init__(self, collector: DataCollector, checkpoint_every: int, block_size: int | None) -> None:
        self.collector = collector
        self.checkpoint_every = checkpoint_every
        self.block_size = block_size
        self.declared: dict[int, int | None] = {}
        self.failures: dict[int, tuple[str, Exception]] = {}
        self.checkpoint_spec: Any = None
        self.key_impls: list[Any] = []  # per leaf of the checkpointed state: its PRNG implementation, if a key
        self._deliveries = JobQueue(f"jaxstow-{type(collector).__name__}", _PENDING_DELIVERIES)
        register_sender = getattr(collector, "register_sender", None)
        if register_sender is not None:  # a collector that closes its file waits for the blocks still on their way
            register_sender(self._deliveries.wait)

    # -- outside jit ---------------------------------------------------------------------------------------------

    def init(
        self, init_sample: Any, init_checkpoint: Any = None, static_information: StaticInformation | None = None
    ) -> SavingState:
        """Register a chain with the collector and return its saving state.

        Under ``jax.vmap``, one chain per element mapped, in order, whose states come back mapped as the samples are.
        """
        information = StaticInformation() if static_information is None else static_information
        spec = spec_of(init_sample)
        checkpoint_spec = spec_of(init_checkpoint)
        checkpoint_treedef: PyTreeDef = jax.tree.structure(checkpoint_spec)
        if self.declared and checkpoint_treedef != jax.tree.structure(self.checkpoint_spec):
            raise ArgumentError("every chain of one saving strategy needs an init_checkpoint of the same structure")
        vmaps = jax_compat.enclosing_vmaps()
        chains = tuple(size for _, size in vmaps)
        registered = [
            self._register(init_sample, init_checkpoint, information, checkpoint_spec)
            for _ in range(int(np.prod(chains)))
        ]
        table = np.array(registered, np.int32).reshape(*chains, 3)
        chain_ids, sent, steps = table[..., 0], table[..., 1], table[..., 2]
        if self.block_size is None:  # chosen once: the chains' states stack only if their buffers have one shape
            self.block_size = block_rows(_sample_bytes(spec), information.samples_collected, _MAX_BLOCK)
        rows = self.block_size
        state = SavingState(
            chain_id=jnp.asarray(chain_ids),
            buffer=jax.tree.map(lambda leaf: jnp.zeros((*chains, rows, *leaf.shape), leaf.dtype), spec),
            sent=jnp.asarray(sent),
            fill=jnp.zeros(chains, jnp.int32),
            step=jnp.asarray(steps),
            # The id travels as the host's answer, not as ``chain_id``: a value the compiler sees never change, used in
            # the loop, slows the whole loop down (about 6% of an SGLD step of 8 chains).
            token=jnp.asarray(chain_ids),
        )
        return jax.tree.map(lambda leaf: jax_compat.mapped_by(leaf, vmaps), state) if vmaps else state

    def _register(
        self, init_sample: Any, init_checkpoint: Any, information: StaticInformation, checkpoint_spec: Any
    ) -> tuple[int, int, int]:
        """Register one chain; its id, and the samples and steps of the checkpoint it continues from (or 0, 0)."""
        chain_id = self.collector.register_chain(
            init_sample=init_sample, init_checkpoint=init_checkpoint, static_information=information
        )
        self.declared[chain_id] = information.samples_collected
        self.checkpoint_spec = checkpoint_spec
        self.key_impls = [
            jax.random.key_impl(leaf) if _is_key(leaf) else None for leaf in jax.tree.leaves(init_checkpoint)
        ]
        resumed = self.collector.resume().get(chain_id)
        if resumed is None:
            return chain_id, 0, 0
        conform(resumed.solver_state, checkpoint_spec, what=f"checkpointed solver state of chain {chain_id}")
        return chain_id, resumed.sample_count, resumed.step

    def postprocess(self, saving_state: SavingState, solver_state: Any = None) -> Any:
        """Send the buffered rest, wait for the collector and return the samples (``solver_state`` is unused)."""
        del solver_state
        state = jax.device_get(saving_state)  # the run is over: every block it sent is queued
        self._deliveries.wait()
        if shared := shared_chains(state.chain_id):
            raise shared_state_error(shared, type(self.collector).__name__)
        leaves = jax.tree.leaves(state.buffer)
        chains = list(np.ndindex(np.shape(state.chain_id)))
        for index in chains:
            chain_id, first, rows = int(state.chain_id[index]), int(state.sent[index]), int(state.fill[index])
            if rows:
                self._deliver(chain_id, first, [leaf[index][:rows] for leaf in leaves])
        for index in chains:
            chain_id = int(state.chain_id[index])
            self._attempt(chain_id, f"finalizing chain {chain_id}", self.collector.finalize, chain_id)
        self._raise_failures(int(state.chain_id[index]) for index in chains)
        counts = {int(state.chain_id[index]): int(state.sent[index] + state.fill[index]) for index in chains}
        overflows = [
            (chain_id, count, declared)
            for chain_id, count in counts.items()
            if (declared := self.declared.get(chain_id)) is not None and count > declared
        ]
        if overflows:
            raise SampleCountError(
                overflows,
                f"all of them were passed to the {type(self.collector).__name__}; declare the right number, or "
                "samples_collected=None when it is not known in advance",
            )
        results = [
            {"sample_count": jnp.asarray(count), "samples": self.collector.finished(chain_id)}
            for chain_id, count in counts.items()
        ]
        return results[0] if np.ndim(state.chain_id) == 0 else results

    def _raise_failures(self, chain_ids: Any) -> None:
        for chain_id in chain_ids:
            failure = self.failures.pop(chain_id, None)
            if failure is not None:
                what, error = failure
                raise failed(
                    CollectorError, f"{type(self.collector).__name__} failed while {what}: {error}", error
                ) from error

    # -- inside jit ----------------------------------------------------------------------------------------------

    def save(
        self,
        saving_state: SavingState,
        keep: Any,
        sample: Any,
        scheduler_state: Any = None,
        solver_state: Any = None,
    ) -> tuple[SavingState, None]:
        """Buffer ``sample`` if ``keep``; send full buffers (and checkpoints) to the host."""
        sample = conform(sample, row_spec(saving_state.buffer, np.ndim(saving_state.chain_id)), what="sample")
        keep = keep_flags(keep, np.shape(saving_state.chain_id))
        checkpoint = None
        if self.checkpoint_every:
            solver = conform(
                solver_state,
                self.checkpoint_spec,
                what="solver state",
                hint="checkpoint_every checkpoints the solver state: pass it to every save, "
                "save(saving_state, keep, sample, solver_state=state), with the structure of init_checkpoint",
            )
            solver = jax.tree.map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, solver)
            checkpoint = (solver, scheduler_state)
        # Only what a step changes goes through it: the compiler cannot see that a field passed through the step
        # (a custom_vmap call) stays the same, and such a field slows every step of the loop down.
        step = saving_state.step if self.checkpoint_every else None
        moving = _Moving(saving_state.buffer, saving_state.sent, saving_state.fill, saving_state.token, step)
        # Wrapped at each trace, not once: a wrapper kept on the strategy would hold it in a reference cycle, and
        # with it the collector's storage, until the garbage collector ran.
        moved = chain_polymorphic(self._chains_step, state_name="saving state")(moving, keep, sample, checkpoint)
        return SavingState(
            saving_state.chain_id,
            moved.buffer,
            moved.sent,
            moved.fill,
            saving_state.step if moved.step is None else moved.step,
            moved.token,
        ), None

    def _chains_step(self, state: _Moving, keep: jax.Array, sample: Any, checkpoint: Any) -> _Moving:
        # Every scalar operation here runs at every step: the bookkeeping of a flush happens in its branch.
        buffer = write_rows(state.buffer, state.fill, sample)
        fill = state.fill + keep.astype(jnp.int32)
        full = jnp.any(fill == jax.tree.leaves(buffer)[0].shape[fill.ndim])
        answer = token_spec(state.token.shape)

        def wait(token: jax.Array, blocks: Any, *_: Any) -> Any:
            return token, blocks[0], blocks[1]

        def send(token: jax.Array, blocks: Any, *checkpoint: Any) -> Any:
            sent, fill, buffer = blocks
            # The numbers go as one small array: each argument of a callback costs its own transfer to the host.
            numbers = jnp.stack([token, sent, fill])
            if checkpoint:  # a checkpoint must be taken exactly once, in order: a side effect
                token = io_callback(_weakly(self._receive), answer, numbers, buffer, *checkpoint)
            else:
                # Delivering a block twice stores the same rows twice, so it needs no side-effect machinery, which
                # costs every step of the loop whether a block is sent or not; the token orders the deliveries.
                token = send_block(_weakly(self._receive_block), numbers, jax.tree.leaves(buffer))
            return token, sent + fill, jnp.zeros_like(fill)

        def send_blocks_only(token: jax.Array, blocks: Any, *_: Any) -> Any:
            return send(token, blocks)

        if checkpoint is None or state.step is None:
            step = state.step
            token, sent, fill = jax.lax.cond(full, send, wait, state.token, (state.sent, fill, buffer))
        else:
            step = state.step + 1
            due = jnp.any(step % self.checkpoint_every == 0)
            blocks = (state.sent, fill, buffer)
            branch = jnp.where(due, 2, full.astype(jnp.int32))
            token, sent, fill = jax.lax.switch(
                branch, [wait, send_blocks_only, send], state.token, blocks, (step, *checkpoint)
            )
        return _Moving(buffer, sent, fill, token, step)

    # -- on the host ---------------------------------------------------------------------------------------------

    def _receive(self, numbers: Any, buffer: Any, checkpoint: Any = None) -> np.ndarray:
        """The callback: queue the blocks for the collector and answer with the token at once.

        ``numbers`` holds each chain's token (its id), samples sent before its block and rows in its block; the
        token only orders the callbacks, so the answer need not wait for the numbers to reach the host.
        A checkpoint is taken before the callback returns, after every block before it: the host's state (a data
        loader's position) must be read at this step, and the run must not go on before its checkpoint is stored.
        """
        if checkpoint is None:
            self._deliveries.submit(functools.partial(self._hand_over, numbers, buffer, None))
        else:
            self._deliveries.wait()
            self._hand_over(numbers, buffer, checkpoint)
        return np.array(numbers[0], np.int32)  # a copy: the callback's arguments are the run's memory

    def _receive_block(self, numbers: np.ndarray, *leaves: np.ndarray) -> np.ndarray:
        return self._receive(numbers, leaves)

    def _hand_over(self, numbers: Any, buffer: Any, checkpoint: Any) -> None:
        """Hand each chain's block (and checkpoint) to the collector, on the deliveries' thread."""
        chain_ids, firsts, fills = np.asarray(numbers)  # a block's first sample: the samples sent before it
        if shared := shared_chains(chain_ids):  # their blocks would mix: they are kept from the collector
            error = shared_state_error(shared, type(self.collector).__name__)
            for chain_id in shared:
                self.failures.setdefault(chain_id, ("receiving the run's blocks", error))
        leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(buffer)]
        for index in np.ndindex(chain_ids.shape):
            count = int(fills[index])
            if count:
                self._deliver(int(chain_ids[index]), int(firsts[index]), [leaf[index][:count] for leaf in leaves])
        if checkpoint is not None:
            self._checkpoint(chain_ids, firsts + fills, checkpoint)

    def _checkpoint(self, chain_ids: np.ndarray, counts: np.ndarray, checkpoint: Any) -> None:
        steps, solver, scheduler = checkpoint
        steps = np.asarray(steps)  # on the host: a JAX operation inside a callback can deadlock the run
        solver_leaves = jax.tree.leaves(jax.device_get(solver))
        solver_treedef: PyTreeDef = jax.tree.structure(self.checkpoint_spec)
        scheduler = jax.device_get(scheduler)
        records = {}
        for index in np.ndindex(chain_ids.shape):
            state = solver_treedef.unflatten(
                [
                    np.array(leaf[index]) if impl is None else jax.random.wrap_key_data(leaf[index], impl=impl)
                    for leaf, impl in zip(solver_leaves, self.key_impls, strict=True)
                ]
            )
            records[int(chain_ids[index])] = ChainCheckpoint(
                step=int(steps[index]),
                sample_count=int(counts[index]),
                solver_state=state,
                scheduler_state=jax.tree.map(lambda leaf, index=index: np.array(leaf[index]), scheduler),
            )
        live = {chain_id: record for chain_id, record in records.items() if chain_id not in self.failures}
        if not live:
            return
        try:  # the chains of one step together: a collector may store them all at once
            self.collector.checkpoint_chains(live)
        except Exception as error:
            for chain_id, record in live.items():
                self.failures[chain_id] = (f"checkpointing chain {chain_id} at step {record.step}", error)

    def _deliver(self, chain_id: int, first: int, values: Sequence[np.ndarray]) -> None:
        rows = len(values[0]) if values else 0
        what = f"saving samples {first}..{first + rows - 1} of chain {chain_id}"
        self._attempt(chain_id, what, self.collector.save, chain_id, first, values)

    def _attempt(self, chain_id: int, what: str, action: Callable[..., Any], *args: Any) -> None:
        """Run a collector call unless the chain failed before; remember the first failure."""
        if chain_id in self.failures:
            return
        try:
            action(*args)
        except Exception as error:
            self.failures[chain_id] = (what, error)
