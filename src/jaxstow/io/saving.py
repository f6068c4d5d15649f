"""``jaxstow.io.save``: stream the samples of a jit-compiled run to a data collector on the host, in blocks.

The saving state carries a device buffer of two blocks of ``block_size`` samples per chain, used as a ring. ``save``
writes each sample into its next row (counting it only if ``keep`` is true); the call after a chain's block filled
sends every chain's block to the host, in one host callback that also carries each chain's id, the index of its
block's first sample and where the block lies in the ring, so the collector can place blocks that arrive in any
order (or twice: a block lands at its own rows). The block sent holds none of that call's sample (written into the
row after the block, where the next block starts): it is the same in both branches of a ``lax.cond`` that ``vmap``
runs for every chain, whichever each chain takes. That makes delivering
blocks free of side effects, so it is a callback like ``pure_callback`` (:mod:`jaxstow.io.host_block`, which spares
the block a copy), costing nothing at the steps that send no block; the same callback, with a side effect, takes the
checkpoints. Every ``checkpoint_every`` steps the buffers are sent along with the solver state, which the collector
checkpoints.

On the host, :mod:`jaxstow.io.receiving` hands the blocks to the collector: inside the callback, from the run's own
buffer, to a collector that copies them at once (the built-in ones), else as copies on a thread of the strategy's
own, while the run goes on. ``postprocess_save`` sends the rest, waits for the collector and hands the run's samples
over: the strategy and its collector keep none of them, and may serve any number of runs, each with chains of its
own. An error inside the collector surfaces there, with its cause.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import PyTreeDef

from jaxstow._format.leaves import key_impl_name
from jaxstow._util import arguments, jax_compat
from jaxstow.errors import ArgumentError, CollectorError, SampleCountError
from jaxstow.io.batching import (
    block_rows,
    bytes_per_sample,
    chain_polymorphic,
    conform,
    keep_flags,
    refuse_chain_axes,
    row_spec,
    shared_chains,
    shared_state_error,
    spec_of,
)
from jaxstow.io.chain_steps import ChainSteps, Moving
from jaxstow.io.collector import (
    DataCollector,
    refuse_rows_beyond,
    registered_chain,
    released,
    resumed_chain,
    rows_start,
    together,
)
from jaxstow.io.memory import MemoryCollector
from jaxstow.io.receiving import Receiver, ran_already, ring_pieces, strategy_gone
from jaxstow.io.save_arguments import (
    checked_collector,
    checked_information,
    checked_state,
    checked_steps,
    is_key,
    refuse_keys,
    refuse_leafless,
)
from jaxstow.io.scheduler import static_information as StaticInformation

__all__ = ["Saving", "SavingState", "save"]

#: At most this many rows in a chain's block when ``block_size`` is not given (see ``batching.block_rows``).
_MAX_BLOCK = 1 << 16

InitSave = Callable[..., Any]
Save = Callable[..., tuple[Any, None]]
PostprocessSave = Callable[..., Any]
Saving = tuple[InitSave, Save, PostprocessSave]


class SavingState(NamedTuple):
    """The device side of :func:`save` for one chain (or, stacked, for several).

    Every field has the chains' shape, except ``buffer``: the sample's structure with leaves
    ``(*chains, 2 * block_size, *leaf)``, a ring of two blocks.
    """

    chain_id: jax.Array
    buffer: Any
    #: ``(*chains, 5)``: the :attr:`strategy`, :attr:`token`, :attr:`sent`, :attr:`fill` and :attr:`row` of each
    #: chain, one array (a loop carries them in one buffer).
    counts: jax.Array
    #: 1 where the chain's block is full: the next call of ``save`` sends it.
    full: jax.Array
    step: jax.Array  # calls of save since the start of the run (counted only with checkpoints)

    @property
    def chains(self) -> tuple[int, ...]:
        """The shape of the chains: ``()`` for one chain, one axis per ``vmap`` that made or ran them."""
        return tuple(np.shape(self.chain_id))

    @property
    def chain_fields(self) -> dict[str, int]:
        """Fields that hold an array per chain, and the number of axes of each chain's (``checked_state`` checks)."""
        return {"full": 0, "counts": 1}

    @property
    def strategy(self) -> jax.Array:
        """The number of the saving strategy whose ``init_save`` made the state: its host takes no other's blocks."""
        return self.counts[..., 0]

    @property
    def token(self) -> jax.Array:
        """The chain's id, as the host's last answer: orders the callbacks and names the chain to the host."""
        return self.counts[..., 1]

    @property
    def sent(self) -> jax.Array:
        """The samples kept and sent to the host since the start of the run."""
        return self.counts[..., 2]

    @property
    def fill(self) -> jax.Array:
        """The samples kept since then, in the block (the rows of the ring before :attr:`row`)."""
        return self.counts[..., 3]

    @property
    def row(self) -> jax.Array:
        """The ring row of the next sample, counted on past the ring's end until the next block: the block is the
        ``fill`` rows before it."""
        return self.counts[..., 4]

    @property
    def sample_count(self) -> jax.Array:
        """The samples kept since the start of the run."""
        return self.sent + self.fill


@arguments.checked_arguments
def save(
    data_collector: DataCollector | None = None, checkpoint_every: int = 0, *, block_size: int | None = None
) -> Saving:
    """Initializes asynchronous saving of samples and checkpoints, as jax_sgmc's ``io.save`` does.

    Kept samples reach ``data_collector`` on the host in blocks, while the run goes on. See docs/sampling.md.

    Args:
        data_collector: Where the samples go (a :class:`~jaxstow.io.MemoryCollector` by default).
        checkpoint_every: Checkpoint ``solver_state`` and ``scheduler_state`` every ``n`` calls of ``save`` (0: never).
        block_size: Samples per chain sent at once (default: a power of two, at most 1 MiB; two held per chain).

    Returns:
        ``(init_save, save, postprocess_save)``: ``init_save(init_sample, init_checkpoint, static_information)``
        registers a chain (under ``jax.vmap``, one per element it maps, each with a state of its own);
        ``save(saving_state, keep, sample, scheduler_state=None, solver_state=None)`` runs inside jit;
        ``postprocess_save(saving_state, solver_state)`` returns the samples.

    Raises:
        ArgumentError: A negative ``checkpoint_every``, a ``block_size`` below 1, a sample of no arrays.

    >>> import jax, jax.numpy as jnp
    >>> from jaxstow import io, scheduler
    >>> init_save, save, postprocess_save = io.save(io.MemoryCollector())
    >>> state = init_save({'iteration': jnp.array(0)}, {}, scheduler.static_information(samples_collected=3))
    >>> state, _ = jax.lax.scan(lambda s, it: save(s, it % 2 == 0, {'iteration': it}), state, jnp.arange(5))
    >>> print(postprocess_save(state, None))
    {'sample_count': Array(3, dtype=int32, weak_type=True), 'samples': {'iteration': array([0, 2, 4], dtype=int32)}}
    """
    checked_steps("checkpoint_every", checkpoint_every, least=0, meaning="0 (never) or a number of steps")
    if block_size is not None:
        checked_steps("block_size", block_size, least=1, meaning="a number of samples, at least 1")
    collector = MemoryCollector() if data_collector is None else checked_collector(data_collector)
    problem = getattr(collector, "checkpoint_problem", lambda: None)() if checkpoint_every else None
    if problem is not None:
        raise ArgumentError(f"io.save(checkpoint_every={checkpoint_every}): {problem}")
    streaming = _Streaming(collector, int(checkpoint_every), None if block_size is None else int(block_size))
    return (
        arguments.checked_arguments(streaming.init, name="init_save"),
        arguments.checked_arguments(streaming.save, name="save"),
        arguments.checked_arguments(streaming.postprocess, name="postprocess_save"),
    )


@functools.partial(jax.jit, static_argnames=("rows", "layout"))
def _fresh_state(
    table: jax.Array, *, rows: int, layout: tuple[tuple[tuple[int, ...], np.dtype], ...]
) -> tuple[jax.Array, list[jax.Array], jax.Array, jax.Array, jax.Array]:
    """The arrays of a new :class:`SavingState` (``table``: each chain's strategy, id, samples sent and step; ``layout``: each
    sample leaf's shape and dtype), made in one call: each array made alone costs a dispatch of its own."""
    table = jnp.asarray(table)  # a numpy array under jax.disable_jit()
    chains = table.shape[:-1]
    buffers = [jnp.zeros((*chains, 2 * rows, *shape), dtype) for shape, dtype in layout]
    # The id travels as the host's answer (the token), not as ``chain_id``: a value the compiler sees never change,
    # used in the loop, slows the whole loop down (about 6% of an SGLD step of 8 chains).
    counts = jnp.zeros((*chains, 5), jnp.int32).at[..., :3].set(table[..., :3])  # strategy, token (id), sent, fill, row
    full = jnp.zeros(chains, jnp.int32)
    return table[..., 1], buffers, counts, full, table[..., 3]


class _Streaming:
    """One saving strategy: its host side (the collector, the chains whose run goes on, the failures met there)."""

    def __init__(self, collector: DataCollector, checkpoint_every: int, block_size: int | None) -> None:
        self.collector = collector
        self.checkpoint_every = checkpoint_every
        self.block_size = block_size
        #: The sample bytes and rows of the blocks of the run whose chains are registered (with no ``block_size``).
        self.run_blocks: tuple[int, int] | None = None
        self.host = Receiver(collector, checkpoint_every)
        #: What the compiled program of a run holds (JAX keeps it with the program, in caches that outlive the run):
        #: nothing of the collector's, which the run's samples go to through the state's strategy number.
        self.steps = ChainSteps(checkpoint_every)

    # -- outside jit ---------------------------------------------------------------------------------------------

    def init(
        self, init_sample: Any, init_checkpoint: Any = None, static_information: StaticInformation | None = None
    ) -> SavingState:
        """Register a chain with the collector and return its saving state.

        Under ``jax.vmap``, one chain per element mapped, in order, whose states come back mapped as the samples are.
        """
        information = checked_information(static_information)
        spec = spec_of(init_sample)
        refuse_leafless(spec)
        refuse_keys(spec)
        checkpoint_spec = spec_of(init_checkpoint)
        checkpoint_treedef: PyTreeDef = jax.tree.structure(checkpoint_spec)
        if self.host.live and checkpoint_treedef != jax.tree.structure(self.host.checkpoint_spec):
            raise ArgumentError("every chain of one saving strategy needs an init_checkpoint of the same structure")
        vmaps = jax_compat.enclosing_vmaps()
        chains = tuple(size for _, size in vmaps)
        rows = self._block_rows(bytes_per_sample(spec), information.samples_collected, running=bool(self.host.live))
        registered = [
            self._register(init_sample, init_checkpoint, information, checkpoint_spec)
            for _ in range(int(np.prod(chains)))
        ]
        table = np.array([(self.host.number, *chain) for chain in registered], np.int32).reshape(*chains, 4)
        treedef: PyTreeDef = jax.tree.structure(spec)
        layout = tuple((tuple(leaf.shape), np.dtype(leaf.dtype)) for leaf in jax.tree.leaves(spec))
        chain_id, buffers, counts, full, step = _fresh_state(table, rows=rows, layout=layout)
        state = SavingState(chain_id, treedef.unflatten(buffers), counts, full, step)
        return jax.tree.map(lambda leaf: jax_compat.mapped_by(leaf, vmaps), state) if vmaps else state

    def _block_rows(self, sample_bytes: int, samples_collected: int | None, *, running: bool) -> int:
        """The rows of a chain's block: ``block_size``, else chosen for each run from its samples; a chain added to
        a run whose chains are registered gets theirs (the chains' states stack only if their buffers have one
        shape)."""
        if self.block_size is not None:
            return self.block_size
        if not (running and self.run_blocks is not None and self.run_blocks[0] == sample_bytes):
            self.run_blocks = (sample_bytes, block_rows(sample_bytes, samples_collected, _MAX_BLOCK))
        return self.run_blocks[1]

    def _register(
        self, init_sample: Any, init_checkpoint: Any, information: StaticInformation, checkpoint_spec: Any
    ) -> tuple[int, int, int]:
        """Register one chain; its id, and the samples and steps of the checkpoint it continues from (or 0, 0)."""
        chain_id = registered_chain(self.collector, init_sample, init_checkpoint, information, taken=self.host.live)
        self.host.live[chain_id] = information.samples_collected
        self.host.failures.pop(chain_id, None)  # of a state of an earlier run, used again
        self.host.device_blocks.pop(chain_id, None)
        self.host.checkpoint_spec = checkpoint_spec
        self.host.key_impls = [
            (jax.random.key_impl(leaf), key_impl_name(leaf.dtype)) if is_key(leaf) else None
            for leaf in jax.tree.leaves(init_checkpoint)
        ]
        try:
            resumed = resumed_chain(self.collector, chain_id, checkpointing=self.checkpoint_every > 0)
        except BaseException:
            del self.host.live[chain_id]  # registered, but it never ran
            raise
        if resumed is not None:
            conform(resumed.solver_state, checkpoint_spec, what=f"checkpointed solver state of chain {chain_id}")
        self.host.starts[chain_id], step = (0, 0) if resumed is None else (resumed.sample_count, resumed.step)
        rows_start(self.collector, chain_id, self.host.starts[chain_id])
        return chain_id, self.host.starts[chain_id], step

    def postprocess(self, saving_state: SavingState, solver_state: Any = None) -> Any:
        """Send the buffered rest, wait for the collector and hand the samples over (``solver_state`` is unused).

        The collector then keeps none of the run's samples (:meth:`DataCollector.release`), unless the run failed."""
        del solver_state
        checked_state(saving_state, SavingState, call="postprocess_save")
        # The run is over on every device (a replicated state's copies too, whose blocks come from each device):
        # every block it sent is handed over, or queued.
        state = jax.device_get(jax.block_until_ready(saving_state))  # type: ignore[no-untyped-call]
        host = self.host
        strategies = np.asarray(state.strategy)
        if any(strategy_gone(int(number)) for number in strategies.flat):
            raise CollectorError(
                "postprocess_save was given a saving state made by the init_save of an io.save that is gone (io.save "
                "was called again, as a notebook cell run again does, and nothing holds the functions of the one "
                "before): no collector got its run's samples. Make the state with this strategy's init_save, after "
                "io.save, state = init_save(...), and run it again"
            )
        if np.any(strategies != host.number):  # its chains are another strategy's: left to it
            raise ArgumentError(
                "postprocess_save was given a saving state that the init_save of another io.save strategy made: give "
                "it to the postprocess_save returned with that init_save, which has its samples"
            )
        host.wait()
        name = type(self.collector).__name__
        if shared := shared_chains(np.ravel(state.chain_id).tolist()):
            raise shared_state_error(shared, name)
        chains = list(np.ndindex(np.shape(state.chain_id)))
        chain_ids = [int(state.chain_id[index]) for index in chains]
        if over := [chain_id for chain_id in chain_ids if chain_id not in host.live]:
            for chain_id in over:
                host.failures.pop(chain_id, None)
            raise ran_already(over, name)
        counts = {int(state.chain_id[index]): int(state.sent[index] + state.fill[index]) for index in chains}
        host.refuse_initial_state(counts)
        numbers = [(int(state.sent[index]), int(state.fill[index]), int(state.row[index])) for index in chains]
        rings = [[leaf[index] for leaf in jax.tree.leaves(state.buffer)] for index in chains]
        for chain_id, chain_numbers, ring in zip(chain_ids, numbers, rings, strict=True):
            for first, rows in ring_pieces(*chain_numbers, len(ring[0])):
                host.deliver(chain_id, first, [leaf[rows] for leaf in ring])
        overflows = [
            (chain_id, count, declared)
            for chain_id, count in counts.items()
            if (declared := host.live.get(chain_id)) is not None and count > declared
        ]
        if overflows and self.checkpoint_every:  # left unfinished, its checkpoints kept: the right call resumes
            if callable(close := getattr(self.collector, "close", None)):  # its file, for that call
                host.attempt_together(chain_ids, "closing the run's file", lambda live: close())
        else:
            host.attempt_together(
                chain_ids,
                "trimming the run's chains",
                lambda live: self.collector.trim_chains({c: counts[c] for c in live}),
            )
            host.attempt_together(chain_ids, "finalizing the run's chains", together(self.collector, "finalize"))
        host.raise_failures(chain_ids)
        if overflows:
            after = ", and the run is left unfinished: call it again" if self.checkpoint_every else "; run it again"
            advice = "declaring the right number, or samples_collected=None when it is not known in advance"
            raise SampleCountError(overflows, f"all of them were passed to the {name}{after} {advice}")
        refuse_rows_beyond(self.collector, counts)
        samples = together(self.collector, "finished")(list(counts))
        for chain_id, chain_numbers, ring, chain_samples in zip(chain_ids, numbers, rings, samples, strict=True):
            host.check_rows_kept(chain_id, chain_numbers, ring, chain_samples)
        results = []
        for (chain_id, count), chain_samples in zip(counts.items(), samples, strict=True):
            results.append({"sample_count": jnp.asarray(count), "samples": chain_samples})
            released(self.collector, chain_id)
            del host.live[chain_id]
            host.device_blocks.pop(chain_id, None)
        return results[0] if np.ndim(state.chain_id) == 0 else results

    # -- inside jit ----------------------------------------------------------------------------------------------

    def save(
        self,
        saving_state: SavingState,
        keep: Any,
        sample: Any,
        scheduler_state: Any = None,
        solver_state: Any = None,
    ) -> tuple[SavingState, None]:
        """Buffer ``sample`` if ``keep``; send full buffers (and checkpoints) to the host.

        What is saved is a value, which no gradient flows through: a function that calls ``save`` may be
        differentiated (``jax.grad``), and its gradient is that of the same function without the call.
        """
        checked_state(saving_state, SavingState, call="save")
        refuse_missing_chains = getattr(self.collector, "refuse_missing_chains", None)
        if callable(refuse_missing_chains):  # a stopped run continued with fewer chains: refused before it computes
            refuse_missing_chains()
        spec = row_spec(saving_state.buffer, np.ndim(saving_state.chain_id))
        refuse_chain_axes(sample, spec, np.shape(saving_state.chain_id))
        sample = conform(sample, spec, what="sample")
        sample = jax.lax.stop_gradient(sample)
        keep = keep_flags(keep, np.shape(saving_state.chain_id))
        checkpoint = None
        if self.checkpoint_every:
            solver = conform(
                solver_state,
                self.host.checkpoint_spec,
                what="solver state",
                hint="checkpoint_every checkpoints the solver state: pass it to every save, "
                "save(saving_state, keep, sample, solver_state=state), with the structure of init_checkpoint",
            )
            solver = jax.tree.map(lambda leaf: jax.random.key_data(leaf) if is_key(leaf) else leaf, solver)
            checkpoint = jax.lax.stop_gradient((solver, scheduler_state))
        # Only what a step changes goes through it: the compiler cannot see that a field passed through the step
        # (a custom_vmap call) stays the same, and such a field slows every step of the loop down.
        step = saving_state.step if self.checkpoint_every else None
        moving = Moving(saving_state.buffer, saving_state.counts, saving_state.full, step)
        # Wrapped at each trace, not once: a wrapper kept on the strategy would hold it in a reference cycle, and
        # with it the collector's storage, until the garbage collector ran.
        moved = chain_polymorphic(self.steps.step, state_name="saving state")(moving, keep, sample, checkpoint)
        return SavingState(
            saving_state.chain_id,
            moved.buffer,
            moved.counts,
            moved.full,
            saving_state.step if moved.step is None else moved.step,
        ), None
