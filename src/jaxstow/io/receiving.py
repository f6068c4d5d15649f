"""The host side of :func:`jaxstow.io.save`: the blocks and checkpoints that a run's callbacks hand over, given to the
collector.

A collector that copies what it keeps at once (:func:`~jaxstow.io.collector.copies_at_once`: the
:class:`~jaxstow.io.MemoryCollector`, which copies each block into storage reused from run to run, and the
:class:`~jaxstow.io.HDF5Collector`, which queues a copy for its writer) gets each block inside the callback, as views
of the run's own buffer: no other copy, no other thread, and the memory a run touches is memory it touched before.
Any other collector gets copies of the blocks, in memory reused from block to block, on a thread of the strategy's own
that hands them over in order while the run goes on, so that its writing never holds the run up. Failures are kept
per chain and raised by ``postprocess_save``, with their cause.
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from jaxstow._format.leaves import KeyData
from jaxstow.errors import CollectorError, failed
from jaxstow.io import host_buffers
from jaxstow.io.batching import STATE_PER_CHAIN, shared_chains, shared_state_error
from jaxstow.io.collector import (
    ChainCheckpoint,
    DataCollector,
    copies_at_once,
    save_block,
    stores_key_data,
    together,
)
from jaxstow.io.displaced_runs import DisplacedRuns
from jaxstow.io.job_queue import JobQueue
from jaxstow.io.row_writes import RowWrites

__all__ = ["Receiver", "ran_already", "ring_pieces", "routed", "strategy_gone"]

#: The number of the next saving strategy made in this process, and each strategy's host by its number.
_NUMBERS = itertools.count(1)
_HOSTS: weakref.WeakValueDictionary[int, Receiver] = weakref.WeakValueDictionary()

#: At most this many callbacks' blocks wait for a collector fed on the strategy's thread; a callback beyond them
#: waits until one is delivered.
_PENDING_DELIVERIES = 4

Block = tuple[int, int, Sequence[np.ndarray]]  # chain id, index of the first row, the rows of each leaf
#: The place of the device that sent a callback (replica, partition) where each device of a run sends its own.
Device = tuple[int, int] | None


def ring_pieces(first: int, fill: int, row: int, ring: int) -> list[tuple[int, slice]]:
    """A block's pieces in its chain's ring of ``ring`` rows: the index of each piece's first sample, and its rows.

    The block is the ``fill`` rows before ``row`` (counted past the ring's end), its first sample the ``first``.

    >>> ring_pieces(8, 3, 5, 5), ring_pieces(8, 3, 6, 5), ring_pieces(8, 0, 2, 5)
    ([(8, slice(2, 5, None))], [(8, slice(3, 5, None)), (10, slice(0, 1, None))], [])
    """
    start = (row - fill) % ring
    head = min(fill, ring - start)
    pieces = [(first, slice(start, start + head)), (first + head, slice(0, fill - head))]
    return [(index, rows) for index, rows in pieces if rows.stop > rows.start]


def ran_already(chain_ids: Sequence[int], collector: str) -> CollectorError:
    """The error of a saving state used again after ``postprocess_save`` ended its run."""
    return CollectorError(
        f"chain{'s' if len(chain_ids) > 1 else ''} {', '.join(map(str, chain_ids))} of this run ran already: "
        f"postprocess_save returned their samples, and the {collector} got none of this run's; a saving state serves "
        "one run, and postprocess_save returns its samples once (keep what it returned the first time): call "
        "init_save for every run, outside jax.jit (a jit-compiled function that calls init_save registers its chains "
        "once, when it is traced, so that every call of it would write into the same chains)"
    )


def routed(method: str, *first: Any) -> Callable[..., np.ndarray]:
    """A host callback that calls ``method`` of the host of the strategy whose number the saving state carries (the
    first row of the callback's ``numbers``), with ``first`` before the callback's arrays.

    It holds no strategy: JAX keeps a compiled program's callbacks in caches that outlive the run, and a function
    traced with the ``save`` of one strategy may run with the state of another (a notebook cell that makes
    ``io.save`` again). A strategy gone (nothing holds its functions) gets nothing: its state is refused by
    ``postprocess_save`` (:func:`strategy_gone`), not by a failure of the run outside jaxstow's errors.
    """

    def call(numbers: np.ndarray, *arrays: Any, device: Device = None) -> np.ndarray:
        strategies: np.ndarray = np.asarray(numbers)[0]
        if not strategies.size:  # no chain: nothing to hand over
            return strategies.astype(np.int32)
        host = _HOSTS.get(int(strategies.flat[0]))
        if host is None:  # its state outlived it: postprocess_save refuses the state, with nothing of it kept
            token: np.ndarray = np.asarray(numbers)[1].astype(np.int32)
            return token
        answer: np.ndarray = getattr(host, method)(*first, numbers, *arrays, device=device)
        return answer

    return call


def strategy_gone(number: int) -> bool:
    """Whether the strategy numbered ``number`` is gone: nothing holds its functions."""
    return number not in _HOSTS


class Receiver:
    """The host side of one saving strategy: its collector, the chains whose run goes on (and the number of samples
    each declared), and the failures met, per chain."""

    def __init__(self, collector: DataCollector, checkpoint_every: int) -> None:
        self.collector = collector
        self.checkpoint_every = checkpoint_every
        self.number = next(_NUMBERS)  # in every saving state it makes, which brings it to the host with each block
        _HOSTS[self.number] = self
        self.at_once = copies_at_once(collector)
        self.live: dict[int, int | None] = {}
        #: Per live chain, the samples it continues from (a checkpoint's), which its run's buffer never held.
        self.starts: dict[int, int] = {}
        self.failures: dict[int, tuple[str, BaseException]] = {}
        #: Per live chain and block (by its first row, then its number of rows), the checksum of its rows and the
        #: device that sent them first, where each device of the run sends its own blocks.
        self.device_blocks: dict[int, dict[int, dict[int, tuple[int, tuple[int, int]]]]] = {}
        self.checkpoint_spec: Any = None
        self.key_data = stores_key_data(collector)
        #: Per leaf of the checkpointed state: its PRNG implementation and that's name, if a key.
        self.key_impls: list[tuple[Any, str] | None] = []
        self._deliveries = JobQueue(f"jaxstow-{type(collector).__name__}", _PENDING_DELIVERIES)
        self._writes = RowWrites()
        self._displaced = DisplacedRuns()
        #: Held around each block or checkpoint handed to the collector, and its bookkeeping: the devices of a
        #: ``pmap`` or ``shard_map`` call back at the same time, each on a thread of its own.
        self._handing_over = threading.Lock()
        register_sender = getattr(collector, "register_sender", None)
        if register_sender is not None:  # a collector that closes its file waits for the blocks still on their way
            register_sender(self._deliveries.wait)

    @property
    def name(self) -> str:
        """The collector's class name, for messages."""
        return type(self.collector).__name__

    def receive(
        self, checkpoint_every: int, numbers: Any, buffer: Any, checkpoint: Any = None, device: Device = None
    ) -> np.ndarray:
        """The callback of a program that checkpoints every ``checkpoint_every`` steps: hand the blocks to the
        collector (or queue copies of them), and answer with the token.

        ``numbers`` holds each chain's strategy, token (its id), samples sent before its block, rows in its block and
        the ring row after them (see :func:`ring_pieces`); ``device`` the place of the device that sends them, where
        each device sends its own (see :meth:`_same_on_every_device`). A checkpoint is taken before the callback
        returns, after every block before it: the host's state (a data loader's position) must be read at this step,
        and the run must not go on before its checkpoint is stored.
        """
        table = np.array(numbers)  # a copy: the arguments are the run's memory
        strategies, chain_ids = table[0], table[1]
        # Each chain's numbers as Python ints, in one call: the loops over chains read nothing of numpy's.
        each_strategy, each_chain, each_first, each_fill, each_row = table.reshape(len(table), -1).tolist()
        if any(strategy != self.number for strategy in each_strategy):
            return self._forward(strategies, checkpoint_every, numbers, buffer, checkpoint, device)
        token: np.ndarray = chain_ids.astype(np.int32)
        if problem := self._traced_otherwise(checkpoint_every, checkpoint):
            self._refuse_program(chain_ids, problem)
            return token
        leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(buffer)]
        chains = len(each_chain)  # not -1: a leaf of no element has no size to tell it
        rings = [leaf.reshape(chains, *leaf.shape[chain_ids.ndim :]) for leaf in leaves]  # the chains on one axis
        rounds = self._blocks(each_chain, each_first, each_fill, each_row, rings)
        if self.at_once:
            self._hand_over(rounds, device)
        else:
            rounds = [[_copied(block) for block in blocks] for blocks in rounds]
            if checkpoint is None:
                self._deliveries.submit(functools.partial(self._hand_over, rounds, device))
            else:
                self._deliveries.wait()
                self._hand_over(rounds, device)
        if checkpoint is not None:
            self._checkpoint(chain_ids, table[2] + table[3], checkpoint)
        return token

    def _forward(
        self, strategies: np.ndarray, checkpoint_every: int, numbers: Any, buffer: Any, checkpoint: Any, device: Device
    ) -> np.ndarray:
        """Hand the blocks of another strategy's saving state to that strategy's host: the function that runs the
        chains calls the save of an earlier ``io.save``, which jax keeps with a function it traced once (a notebook
        cell that makes ``io.save`` again, but not the function calling ``save``)."""
        owners = {int(number) for number in strategies.flat}
        owner = _HOSTS.get(owners.pop())
        if not owners and owner is not None:
            return owner.receive(checkpoint_every, numbers, buffer, checkpoint, device)
        chain_ids = np.array(numbers)[1]
        for index in np.ndindex(chain_ids.shape):  # states of several strategies stacked: none gets the blocks
            host = _HOSTS.get(int(strategies[index]))
            if host is not None:
                error = CollectorError(
                    f"the saving state of chain {int(chain_ids[index])} was stacked with those of another io.save: "
                    "stack only the states that one init_save made"
                )
                host.failures.setdefault(int(chain_ids[index]), ("receiving the run's blocks", error))
        token: np.ndarray = chain_ids.astype(np.int32)
        return token

    def receive_block(
        self, checkpoint_every: int, numbers: np.ndarray, *leaves: np.ndarray, device: Device = None
    ) -> np.ndarray:
        """The callback of blocks without a checkpoint."""
        return self.receive(checkpoint_every, numbers, leaves, device=device)

    def receive_checkpoint(
        self, checkpoint_every: int, layout: PyTreeDef, numbers: np.ndarray, *leaves: np.ndarray, device: Device = None
    ) -> np.ndarray:
        """The callback of blocks with a checkpoint: the leaves of ``(buffer, checkpoint)``, whose structure
        ``layout`` is, as the program that sends them traced it."""
        buffer, checkpoint = layout.unflatten(leaves)
        return self.receive(checkpoint_every, numbers, buffer, checkpoint, device)

    def _first_copy(self, device: tuple[int, int], chain_id: int, first: int, values: Sequence[np.ndarray]) -> bool:
        """Whether the block is new rows: no device sent it (or more of it) before, or its device sent other bytes (another
        run). Rows of one chain that differ from device to device fail: its state went to each device whole (``pmap``
        with ``in_axes=None``, ``shard_map`` with ``P()``). Rows a replicated chain's devices all send are kept once."""
        rows = len(values[0]) if values else 0
        checksum = functools.reduce(lambda crc, leaf: zlib.crc32(np.ascontiguousarray(leaf).data, crc), values, 0)
        blocks = self.device_blocks.setdefault(chain_id, {}).setdefault(first, {})  # by their rows
        if any(more > rows and holder[1] != device for more, holder in blocks.items()):
            return False
        sent = blocks.get(rows)
        if sent is None or (sent[1] == device and sent[0] != checksum):  # new, or another run's on its device
            blocks[rows] = (checksum, device)
            return True
        if sent[1] != device and sent[0] != checksum:
            error = CollectorError(
                f"the saving state of chain {chain_id} went to several devices (jax.pmap with in_axes=None for "
                "it, or jax.shard_map with in_specs=P() for it), which sent other samples as that chain's (rows "
                f"{first}..{first + rows - 1}), so that they would mix in it: split the states over the devices "
                f"as the chains are, one per chain (in_axes=0, or P(axis) with the chains' axis); {STATE_PER_CHAIN}"
            )
            self.failures.setdefault(chain_id, ("receiving the run's blocks", error))
        return False  # another device's copy, or the block again (the same bytes, kept already)

    def _traced_otherwise(self, checkpoint_every: int, checkpoint: Any) -> str:
        """What the program sending a callback, traced with the ``save`` of a strategy (this one, or one made before
        it), does otherwise than this strategy asks: checkpoints at other steps, or of a solver state of another
        structure; ``""`` if nothing."""
        if checkpoint_every != self.checkpoint_every:
            return f"{_checkpoints(checkpoint_every)}, where this one {_checkpoints(self.checkpoint_every)}"
        solver, wanted = None if checkpoint is None else jax.tree.structure(checkpoint[1]), self.checkpoint_spec
        if solver is not None and solver != jax.tree.structure(wanted):
            return f"checkpoints a solver state of the structure {solver}, where this one checkpoints {wanted}"
        return ""

    def _refuse_program(self, chain_ids: np.ndarray, problem: str) -> None:
        """Keep the blocks of a program traced with another strategy's ``save`` from the collector: each chain fails."""
        error = CollectorError(
            f"the function that runs the chains was traced with the save of another io.save, which {problem}: jax "
            "keeps the function it traced first (a notebook cell that makes io.save again, but not the function "
            f"calling save), and the {self.name} got none of this run's samples; define that function again after "
            "io.save, or call jax.clear_caches(), so that it is traced with this strategy's save, then run it again"
        )
        for index in np.ndindex(chain_ids.shape):
            self.failures.setdefault(int(chain_ids[index]), ("receiving the run's blocks", error))

    def _blocks(
        self, chain_ids: list[int], firsts: list[int], fills: list[int], rows: list[int], rings: list[np.ndarray]
    ) -> list[list[Block]]:
        """Each chain's block (the chains' numbers in a row, and each leaf's rings stacked in that order), its rows of
        every leaf, in one piece or two (where it wraps around the ring): the first pieces, then the second ones.
        Chains that share a state, or whose run is over, get none."""
        if shared := shared_chains(chain_ids):  # their blocks would mix: they are kept from the collector
            error = shared_state_error(shared, self.name)
            for chain_id in shared:
                self.failures.setdefault(chain_id, ("receiving the run's blocks", error))
        rounds: list[list[Block]] = [[], []]
        ring = rings[0].shape[1]
        for index, (chain_id, first, fill, row) in enumerate(zip(chain_ids, firsts, fills, rows, strict=True)):
            if chain_id not in self.live:
                self.failures.setdefault(chain_id, ("receiving the run's blocks", ran_already([chain_id], self.name)))
            elif chain_id not in self.failures:
                for blocks, (start, piece) in zip(rounds, ring_pieces(first, fill, row, ring), strict=False):
                    blocks.append((chain_id, start, [leaf[index, piece] for leaf in rings]))
        return [blocks for blocks in rounds if blocks]

    def _hand_over(self, rounds: list[list[Block]], device: Device) -> None:
        """Hand the blocks of one callback to the collector, each round's together (one write, and one flush, for
        all chains), one callback's at a time, those that another device sent before left out."""
        with self._handing_over:  # each block compared with those handed over before it
            for blocks in rounds:
                live = {
                    chain_id: (first, values)
                    for chain_id, first, values in blocks
                    if (device is None or self._first_copy(device, chain_id, first, values))
                    and chain_id not in self.failures
                }
                if not live:
                    continue
                for chain_id, (first, values) in live.items():
                    self._note(chain_id, first, values)
                try:
                    together(self.collector, "save")(live)
                except BaseException as error:  # on the deliveries' thread (or a callback's): no Ctrl-C comes here
                    if not isinstance(error, Exception) and threading.current_thread() is threading.main_thread():
                        raise
                    for chain_id, (first, values) in live.items():
                        self.failures[chain_id] = (_saving(chain_id, first, values), error)

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
                    self._leaf(np.array(leaf[index]), impl)
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
            with self._handing_over:
                together(self.collector, "checkpoint")(live)
        except Exception as error:
            for chain_id, record in live.items():
                self.failures[chain_id] = (f"checkpointing chain {chain_id} at step {record.step}", error)

    def _leaf(self, data: np.ndarray, impl: tuple[Any, str] | None) -> Any:
        """A checkpointed leaf, copied out of the run's buffer; a PRNG key as the collector takes it."""
        if impl is None:
            return data
        return KeyData(data, impl[1]) if self.key_data else _key(data, impl[0])

    def _note(self, chain_id: int, first: int, values: Sequence[np.ndarray]) -> None:
        """Note a block about to be handed to the collector: the rows it writes, and those it writes over."""
        went_back_from = self._writes.note(chain_id, first, len(values[0]) if values else 0)
        self._displaced.before_write(
            self.collector, chain_id, first=first, values=values, went_back_from=went_back_from
        )

    def check_rows_kept(self, chain_id: int, numbers: tuple[int, int, int], ring: Sequence[Any], samples: Any) -> None:
        """Check that the collector kept the rows of the run whose final state holds ``numbers`` and ``ring`` (whose
        rows before the block being filled hold the chain's last block sent): a state from which another run went
        on, later (two calls from one initial state, or the branches of a per-chain ``lax.cond`` that ``vmap`` runs
        for every chain, each a loop of its own), would else get that run's rows, silently."""
        sent, fill, row = numbers
        self._writes.refuse_mixed(chain_id, sent + fill, self.name)
        count = max(0, min(sent - self.starts.pop(chain_id, 0), len(ring[0]) // 2)) if ring else 0
        pieces = ring_pieces(sent - count, count, row - fill, len(ring[0])) if ring else []
        self._displaced.refuse_other_rows(chain_id, sent, pieces, ring, jax.tree.leaves(samples), self.name)

    def refuse_initial_state(self, counts: dict[int, int]) -> None:
        """A :class:`CollectorError` if the state given to ``postprocess_save``, whose chains kept ``counts`` samples,
        counts none of the run's while the collector got some of them: it is the state that ``init_save`` returned
        (or one that no step went through), given in place of the one the run returned. Nothing of the run is
        trimmed or finalized then, so that ``postprocess_save`` of the run's state still gets every sample."""
        if any(count != self.starts.get(chain_id, 0) for chain_id, count in counts.items()):
            return
        for chain_id in counts:
            if (got := self._writes.end(chain_id) - self.starts.get(chain_id, 0)) > 0:
                raise CollectorError(
                    f"postprocess_save was given a saving state that counts none of the samples the {self.name} got "
                    f"from the run (chain {chain_id}: {got} of them): the state init_save returned, not the one the "
                    "run returned? Give it the state the run returned (final = run(state); postprocess_save(final, "
                    "None)); nothing of the run was dropped"
                )

    def deliver(self, chain_id: int, first: int, values: Sequence[np.ndarray]) -> None:
        """Hand a block to the collector (unless its chain failed before)."""
        with self._handing_over:
            self._note(chain_id, first, values)
            self.attempt(
                chain_id, _saving(chain_id, first, values), save_block, self.collector, chain_id, first, values
            )

    def attempt(self, chain_id: int, what: str, action: Callable[..., Any], *args: Any) -> None:
        """Run a collector call unless the chain failed before; remember the first failure."""
        if chain_id in self.failures:
            return
        try:
            action(*args)
        except Exception as error:
            self.failures[chain_id] = (what, error)

    def attempt_together(self, chain_ids: Sequence[int], what: str, action: Callable[[list[int]], Any]) -> None:
        """Run a collector call on the chains that did not fail before, together; a failure is each one's."""
        live = [chain_id for chain_id in chain_ids if chain_id not in self.failures]
        if not live:
            return
        try:
            action(live)
        except Exception as error:
            for chain_id in live:
                self.failures[chain_id] = (what, error)

    def wait(self) -> None:
        """Wait until every block queued for the collector is handed over."""
        self._deliveries.wait()

    def raise_failures(self, chain_ids: Sequence[int]) -> None:
        """Raise the first failure of the chains, as a :class:`~jaxstow.errors.CollectorError` with its cause."""
        for chain_id in chain_ids:
            failure = self.failures.pop(chain_id, None)
            if failure is not None:
                what, error = failure
                raise failed(CollectorError, f"{self.name} failed while {what}: {error}", error) from error


def _checkpoints(every: int) -> str:
    """What a strategy that checkpoints every ``every`` steps (0: never) does, for messages."""
    return f"checkpoints every {every} steps" if every else "never checkpoints"


def _copied(block: Block) -> Block:
    """A block whose rows are copies, kept past the callback."""
    chain_id, first, values = block
    return chain_id, first, [host_buffers.copy(value) for value in values]


def _saving(chain_id: int, first: int, values: Sequence[np.ndarray]) -> str:
    """What a block's delivery was doing, for a failure's message."""
    rows = len(values[0]) if values else 0
    return f"saving samples {first}..{first + rows - 1} of chain {chain_id}"


def _key(data: np.ndarray, impl: Any) -> jax.Array:
    """A PRNG key of ``impl`` from its data, copied out of the run's buffer: a jax array, which jax 0.4 does not make
    of a numpy array (its key would then have no sharding)."""
    key: jax.Array = jax.random.wrap_key_data(jax.device_put(data), impl=impl)
    return key
