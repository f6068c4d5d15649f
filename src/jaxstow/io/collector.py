"""The data collector interface: where the samples of a run go, and where its checkpoints live."""

from __future__ import annotations

import abc
import functools
import inspect
import threading
import weakref
import zlib
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

import numpy as np

from jaxstow.errors import CollectorError, JaxstowError, excerpt
from jaxstow.io.scheduler import static_information as StaticInformation

__all__ = [
    "ChainCheckpoint",
    "DataCollector",
    "DataLoader",
    "copies_at_once",
    "registered_chain",
    "released",
    "resumed_chain",
    "rows_start",
    "refuse_rows_beyond",
    "save_block",
    "stores_key_data",
    "together",
]


class ChainCheckpoint(NamedTuple):
    """A chain's state after ``step`` calls of ``save``, enough to continue the run from there.

    ``sample_count`` samples were kept up to this step; ``solver_state`` has the structure of the ``init_checkpoint``
    given to ``init_save``; ``scheduler_state`` is what ``save`` was given (or ``None``); ``data_loader_state`` is
    what the registered data loader's ``save_state`` returned (or ``None``).
    """

    step: int
    sample_count: int
    solver_state: Any
    scheduler_state: Any = None
    data_loader_state: Any = None


class DataLoader(Protocol):
    """A host-side data loader whose position can be checkpointed with the chains it feeds."""

    def save_state(self, chain_id: int) -> Any:
        """The loader's state for ``chain_id``, as a pytree that :func:`jaxstow.save` can write."""

    def load_state(self, chain_id: int, data: Any) -> None:
        """Go back to a state returned by :meth:`save_state`."""


class DataCollector(abc.ABC):
    """Collects sampled data and data loader states, as jax_sgmc's ``io.DataCollector`` does.

    :func:`jaxstow.io.save` calls :meth:`register_chain` once per chain, :meth:`save` with whole blocks of samples,
    :meth:`checkpoint` every ``checkpoint_every`` steps, then :meth:`trim_chains`, :meth:`finalize`, :meth:`finished`,
    :meth:`release` (each through its ``_chains`` method, taking a ``vmap``'s chains together, calling it for each):

    >>> import jax.numpy as jnp
    >>> from jaxstow import io
    >>> class BlockLog(io.DataCollector):
    ...     def __init__(self):
    ...         self.blocks = []
    ...     def register_data_loader(self, data_loader): pass
    ...     def register_chain(self, init_sample, init_checkpoint, static_information): return 0
    ...     def save(self, chain_id, first, values):
    ...         self.blocks.append((first, len(values[0])))
    ...     def checkpoint(self, chain_id, checkpoint): pass
    ...     def finalize(self, chain_id): pass
    ...     def finished(self, chain_id): return self.blocks
    ...     def resume(self): return {}
    >>> init_save, save, postprocess_save = io.save(BlockLog(), block_size=4)
    >>> state = init_save(jnp.zeros(2), None, io.scheduler.static_information(samples_collected=10))
    >>> for step in range(10):
    ...     state, _ = save(state, True, jnp.full(2, step))
    >>> postprocess_save(state, None)["samples"]
    [(0, 4), (4, 4), (8, 2)]
    """

    #: ``True`` where :meth:`save` copies the rows it keeps (or queues a copy of them) before it returns, and returns
    #: without waiting on storage: :func:`jaxstow.io.save` then calls it from inside the run, with ``values`` that
    #: are views of the run's own buffer, valid only during the call. Otherwise the run's blocks are copied, and
    #: :meth:`save` is called with the copies, which it may keep, on a thread of its own. A subclass that overrides
    #: :meth:`save` or :meth:`save_chains` gets the copies on that thread unless it sets this again.
    copies_blocks: ClassVar[bool] = False
    #: ``True`` where :meth:`checkpoint` and :meth:`checkpoint_chains` store the solver state with
    #: :func:`jaxstow.save` and take its PRNG keys as :class:`~jaxstow._format.leaves.KeyData`, made inside the run
    #: without a call into jax (the built-in collectors); a subclass that overrides either gets jax keys.
    _stores_key_data: ClassVar[bool] = False

    @abc.abstractmethod
    def register_data_loader(self, data_loader: DataLoader) -> None:
        """Register a data loader whose state is checkpointed with the chains."""

    @abc.abstractmethod
    def register_chain(
        self, init_sample: Any = None, init_checkpoint: Any = None, static_information: StaticInformation | None = None
    ) -> int:
        """Register a chain to save samples from and return its id.

        A collector that holds a checkpoint of this chain continues from it (see :meth:`resume`).

        Args:
            init_sample: A sample: the structure, shapes and dtypes of the samples.
            init_checkpoint: A solver state: the structure, shapes and dtypes of the state to checkpoint.
            static_information: The number of samples the chain will keep, if known.

        Returns:
            The chain's id.
        """

    @abc.abstractmethod
    def save(self, chain_id: int, first: int, values: Sequence[np.ndarray]) -> None:
        """Store a block of samples of the chain ``chain_id``, at its rows.

        Blocks may arrive in any order, and more than once: a second delivery must change nothing; rows past the
        chain's last sample may arrive too (see :meth:`trim_chains`). It is called from a thread of its own, one block
        at a time, while the run goes on.

        Args:
            chain_id: The chain's id, from :meth:`register_chain`.
            first: The index of the block's first sample in the chain.
            values: One read-only array per leaf of the sample (in ``jax.tree.leaves`` order), whose rows are the
                samples ``first, first + 1, ...``; nothing changes them later, so they may be kept without a copy.
        """

    def save_chains(self, blocks: Mapping[int, tuple[int, Sequence[np.ndarray]]]) -> None:
        """Blocks of several chains at once, by chain id: ``(first, values)`` as :meth:`save` takes them.

        By default one :meth:`save` per chain; a collector that stores them better together overrides it.
        """
        for chain_id, (first, values) in blocks.items():
            save_block(self, chain_id, first, values)

    @abc.abstractmethod
    def checkpoint(self, chain_id: int, checkpoint: ChainCheckpoint) -> None:
        """Called every ``checkpoint_every`` steps, after the blocks of every sample the checkpoint counts.

        Once the checkpoint is stored, those samples and the checkpoint must survive a crash together.
        """

    def checkpoint_problem(self) -> str | None:
        """Why the collector cannot keep checkpoints, if it cannot (``None``: it can): ``io.save(collector,
        checkpoint_every=n)`` refuses it at once, not at the run's first checkpoint."""
        return None

    def checkpoint_chains(self, checkpoints: Mapping[int, ChainCheckpoint]) -> None:
        """The checkpoints of several chains taken at the same step (those of one ``vmap``), by chain id.

        :func:`jaxstow.io.save` calls this rather than :meth:`checkpoint`. By default it calls :meth:`checkpoint`
        for each chain; a collector that can store them all at once, so that a crash never leaves some chains at
        one checkpoint and others at the one before, overrides it (the :class:`~jaxstow.io.HDF5Collector` does).
        """
        for chain_id, checkpoint in checkpoints.items():
            self.checkpoint(chain_id, checkpoint)

    def trim_chains(self, counts: Mapping[int, int]) -> None:
        """Called after the last block of a run and before :meth:`finalize_chains`, with the number of samples each
        chain kept, by chain id: rows at or past it that :meth:`save` got are no samples of the run, and must be
        dropped. They come from a ``jax.lax.cond`` or ``jax.lax.while_loop`` that ``jax.vmap`` ran for every chain,
        keeping the result of only some (its blocks reach the host either way), or from an earlier call of a
        compiled run with the same initial saving state. By default nothing.
        """
        del counts

    @abc.abstractmethod
    def finalize(self, chain_id: int) -> None:
        """Called after the run: wait for all writing of the chain to be finished."""

    def finalize_chains(self, chain_ids: Sequence[int]) -> None:
        """:meth:`finalize` for the chains of one run (those of one ``vmap``) together, which
        :func:`jaxstow.io.save` calls. By default :meth:`finalize` for each; a collector that finishes them better
        together overrides it (the :class:`~jaxstow.io.HDF5Collector` flushes its file once for all)."""
        for chain_id in chain_ids:
            self.finalize(chain_id)

    @abc.abstractmethod
    def finished(self, chain_id: int) -> Any:
        """The chain's samples as the collector holds them, after :meth:`finalize`."""

    def finished_chains(self, chain_ids: Sequence[int]) -> list[Any]:
        """:meth:`finished` for the chains of one run together, in the order given, which :func:`jaxstow.io.save`
        calls. By default :meth:`finished` for each; the :class:`~jaxstow.io.HDF5Collector` reads them all from one
        opening of its file."""
        return [self.finished(chain_id) for chain_id in chain_ids]

    def release(self, chain_id: int) -> None:
        """Called after :meth:`finished`: the chain's run is over and its samples were handed to the caller, so the
        collector keeps none of them (the next run of the same strategy gets chains of its own). By default nothing.
        """
        del chain_id

    @abc.abstractmethod
    def resume(self) -> Mapping[int, ChainCheckpoint]:
        """Restore the data loader's state and return the last checkpoint of each registered chain that has one."""


_REGISTERING = threading.Lock()


def registered_chain(
    collector: DataCollector, sample: Any, checkpoint: Any, information: StaticInformation, *, taken: Container[int]
) -> int:
    """The id ``collector.register_chain`` gives a new chain, checked to be one: an ``int`` from 0 to 2**31 - 1, none
    of the ``taken`` ids of the chains whose run is not over. One at a time in a process: the runs of threads that
    share a collector are given ids apart."""
    with _REGISTERING:
        chain_id = collector.register_chain(
            init_sample=sample, init_checkpoint=checkpoint, static_information=information
        )
    if isinstance(chain_id, int | np.integer) and not isinstance(chain_id, bool) and 0 <= chain_id < 2**31:
        if int(chain_id) in taken:
            raise CollectorError(
                f"{type(collector).__name__}.register_chain returned the chain id {chain_id}, which a chain whose run "
                "is not over holds (its postprocess_save not called yet): it must return a new id for each chain"
            )
        return int(chain_id)
    raise CollectorError(
        f"{type(collector).__name__}.register_chain returned {excerpt(chain_id)}, which is no chain id: it returns an "
        "int from 0 to 2**31 - 1 that names the chain in its other calls (a missing return gives None)"
    )


def resumed_chain(collector: DataCollector, chain_id: int, *, checkpointing: bool) -> ChainCheckpoint | None:
    """The checkpoint ``collector.resume()`` gives the chain to continue from, checked to be one (or ``None``).

    Without ``checkpointing`` (``checkpoint_every=0``), a ``resume`` written as jax_sgmc's interface leaves it (one
    that returns nothing, or raises ``NotImplementedError``) resumes nothing. Its other errors are a
    :class:`~jaxstow.errors.CollectorError` naming it.
    """
    name = type(collector).__name__
    try:
        resumed = collector.resume()
    except NotImplementedError:
        if not checkpointing:
            return None
        raise CollectorError(
            f"{name}.resume() is not implemented, and io.save(checkpoint_every=...) resumes chains from their "
            "checkpoints with it: implement it, or save with checkpoint_every=0"
        ) from None
    except JaxstowError:
        raise
    except Exception as error:
        raise CollectorError(f"{name}.resume() raised {type(error).__name__}: {error}") from error
    if resumed is None and not checkpointing:
        return None
    if not isinstance(resumed, Mapping):
        raise CollectorError(
            f"{type(collector).__name__}.resume() returned {excerpt(resumed)}: it returns a dict of chain ids to the "
            "ChainCheckpoint each continues from ({} when none does; a missing return gives None)"
        )
    checkpoint = resumed.get(chain_id)
    if checkpoint is not None and not isinstance(checkpoint, ChainCheckpoint):
        raise CollectorError(
            f"{type(collector).__name__}.resume() gave chain {chain_id} {excerpt(checkpoint)}: it gives each chain "
            "the io.ChainCheckpoint that its checkpoint() was given"
        )
    return checkpoint


def save_block(collector: DataCollector, chain_id: int, first: int, values: Sequence[np.ndarray]) -> None:
    """``collector.save(chain_id, first, values)``; for a collector written to jax_sgmc's interface, whose
    ``save(chain_id, values)`` takes one sample's leaves, that of each row of the block in turn, once: a sample given
    before that comes again with other values is a :class:`CollectorError`, as such a collector cannot take it back.

    >>> from jaxstow import io
    >>> class Rows(io.MemoryCollector):
    ...     def save(self, chain_id, values):
    ...         print(chain_id, [value.tolist() for value in values])
    >>> save_block(Rows(), 0, 0, [np.array([[1, 2], [3, 4]]), np.array([5, 6])])
    0 [[1, 2], 5]
    0 [[3, 4], 6]
    """
    if not _takes_rows(type(collector)):
        collector.save(chain_id, first, values)
        return
    given = _rows_given.setdefault(collector, {}).setdefault(chain_id, _RowsGiven(0))
    if first > given.end:
        raise CollectorError(
            f"{type(collector).__name__}.save(chain_id, values) takes the samples in order, but samples {given.end} to "
            f"{first - 1} of chain {chain_id} have not arrived before sample {first}: implement "
            "save(chain_id, first, values), which takes blocks in any order"
        )
    for row in range(len(values[0]) if values else 0):
        sample = [value[row] for value in values]
        checksum = functools.reduce(lambda crc, leaf: zlib.crc32(np.asarray(leaf).tobytes(), crc), sample, 0)
        if first + row < given.end:  # given before (a block delivered again): the same sample, or one it lacks
            if first + row >= given.first and given.checksums[first + row - given.first] != checksum:
                raise CollectorError(
                    _taken_back(collector, chain_id, f"sample {first + row} came again with other values")
                )
            continue
        collector.save(chain_id, sample)  # type: ignore[call-arg]
        given.checksums.append(checksum)


class _RowsGiven:
    """The samples of a chain given to a collector of jax_sgmc's interface: from the ``first``, a checksum of each."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.checksums: list[int] = []

    @property
    def end(self) -> int:
        return self.first + len(self.checksums)


def _taken_back(collector: DataCollector, chain_id: int, what: str) -> str:
    """The message of samples given to ``save(chain_id, values)`` that the run did not keep, which it cannot take back."""
    return (
        f"{type(collector).__name__}.save(chain_id, values) was given samples of chain {chain_id} that its run did not "
        f"keep ({what}), and cannot take them back: another run went on from the same saving state (call init_save for "
        "each run), or a save with checkpoint_every sits in a lax.cond or lax.while_loop whose predicate differs from "
        "chain to chain under vmap (choose the sample there, and call save once per step, outside it); or implement "
        "save(chain_id, first, values), which stores each block at its rows"
    )


def refuse_rows_beyond(collector: DataCollector, counts: Mapping[int, int]) -> None:
    """A :class:`CollectorError` if a collector of jax_sgmc's interface was given more samples of a chain than its
    run kept (``counts``, by chain id)."""
    given = _rows_given.get(collector, {})
    for chain_id, count in counts.items():
        if (end := given[chain_id].end if chain_id in given else 0) > count:
            raise CollectorError(_taken_back(collector, chain_id, f"{end} of them, where the run kept {count}"))


def rows_start(collector: DataCollector, chain_id: int, first: int) -> None:
    """The chain registered now, continuing from a checkpoint that counts ``first`` samples (else 0), is given to a
    collector of jax_sgmc's interface from sample ``first`` on: the rows that an earlier run of its id gave it (a run
    stopped before ``postprocess_save``) count no more."""
    if _takes_rows(type(collector)):
        _rows_given.setdefault(collector, {})[chain_id] = _RowsGiven(first)


def released(collector: DataCollector, chain_id: int) -> None:
    """``collector.release(chain_id)``, the chain's run over, and the count of its samples given to a collector of
    jax_sgmc's interface forgotten: the collector may give the id to a chain of a later run, which starts at 0."""
    collector.release(chain_id)
    _rows_given.get(collector, {}).pop(chain_id, None)


#: Per collector of jax_sgmc's interface, the samples of each chain given to its ``save`` so far.
_rows_given: weakref.WeakKeyDictionary[DataCollector, dict[int, _RowsGiven]] = weakref.WeakKeyDictionary()


@functools.cache
def _takes_rows(kind: type[DataCollector]) -> bool:
    """Whether ``kind.save`` takes ``(chain_id, values)`` alone, as jax_sgmc's ``DataCollector.save`` does."""
    try:
        parameters = list(inspect.signature(kind.save).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the interface documented here
        return False
    if any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters):
        return False
    positional = [parameter for parameter in parameters if parameter.kind in _POSITIONAL]
    return len(positional) == 3  # self, chain_id, values


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def copies_at_once(collector: DataCollector) -> bool:
    """Whether ``collector.save`` copies the rows it keeps before it returns: :attr:`DataCollector.copies_blocks` of
    the class that set it last, unless a class below that one overrides :meth:`~DataCollector.save` or
    :meth:`~DataCollector.save_chains`.

    >>> from jaxstow import io
    >>> class Logged(io.MemoryCollector):
    ...     def save(self, chain_id, first, values):
    ...         super().save(chain_id, first, values)
    >>> copies_at_once(io.MemoryCollector()), copies_at_once(Logged())
    (True, False)
    """
    return _set_by(collector, "copies_blocks", ("save", "save_chains"))


def stores_key_data(collector: DataCollector) -> bool:
    """Whether ``collector``'s checkpoints take PRNG keys as their data on the host (``_stores_key_data``), as
    :func:`copies_at_once` decides for :meth:`~DataCollector.checkpoint` and :meth:`~DataCollector.checkpoint_chains`.

    >>> from jaxstow import io
    >>> class Logged(io.HDF5Collector):
    ...     def checkpoint_chains(self, checkpoints):
    ...         super().checkpoint_chains(checkpoints)
    >>> stores_key_data(io.MemoryCollector()), stores_key_data(Logged.__new__(Logged))
    (True, False)
    """
    return _set_by(collector, "_stores_key_data", ("checkpoint", "checkpoint_chains"))


def together(collector: DataCollector, name: str) -> Callable[..., Any]:
    """``collector``'s method ``<name>_chains``, which takes the chains of a run together; where a subclass overrides
    the method ``name`` for one chain below the class that defines ``<name>_chains``, :class:`DataCollector`'s, which
    calls that override for each chain (so that a subclass's ``save``, ``checkpoint``, ``finalize`` or ``finished``
    sees every chain, as :func:`jaxstow.io.save` calls it).

    >>> from jaxstow import io
    >>> class Logged(io.HDF5Collector):
    ...     def finalize(self, chain_id):
    ...         super().finalize(chain_id)
    >>> collector = Logged.__new__(Logged)
    >>> together(collector, "finalize").func is DataCollector.finalize_chains
    True
    >>> together(collector, "save") == collector.save_chains
    True
    """
    for kind in type(collector).__mro__:
        if f"{name}_chains" in vars(kind):
            break
        if name in vars(kind):
            return functools.partial(vars(DataCollector)[f"{name}_chains"], collector)
    method: Callable[..., Any] = getattr(collector, f"{name}_chains")
    return method


def _set_by(collector: DataCollector, flag: str, methods: tuple[str, ...]) -> bool:
    """``flag`` as the class that set it last sets it, unless a class below that one overrides one of ``methods``."""
    for kind in type(collector).__mro__:
        if flag in vars(kind):
            return bool(vars(kind)[flag])
        if any(method in vars(kind) for method in methods):
            return False
    return False
