"""What the built-in collectors keep per chain: the sample layout, the rows received, resumed checkpoints.

>>> import jax.numpy as jnp
>>> from jaxstow.io.chains import SampleLayout
>>> layout = SampleLayout.of({"w": jnp.zeros((2, 3)), "stats": [jnp.float32(0.0)]})
>>> layout.names
['stats/list_element_0', 'w']
>>> layout.shapes, layout.dtypes, layout.row_bytes
([(), (2, 3)], [dtype('float32'), dtype('float32')], 28)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import PyTreeDef

from jaxstow._format.keypaths import flatten_with_paths
from jaxstow._read.tracing import read_while_tracing
from jaxstow._save_load import load, save
from jaxstow.errors import ArgumentError, CollectorError, StructureMismatchError
from jaxstow.io.collector import ChainCheckpoint, DataLoader
from jaxstow.io.dictionize import joined_names, pytree_dict_keys
from jaxstow.io.stopped_runs import StoppedRun

__all__ = [
    "OTHER_RUN",
    "ChainBook",
    "SampleLayout",
    "read_checkpoint",
    "read_checkpoints",
    "remove_checkpoint",
    "restore_checkpoint",
    "write_checkpoint",
    "write_checkpoints",
]


@dataclasses.dataclass(frozen=True)
class SampleLayout:
    """The leaves of a sample: their names (dict keys joined by ``/``), shapes and dtypes, in leaf order."""

    treedef: PyTreeDef
    names: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[np.dtype[Any]]

    @classmethod
    def of(cls, sample: Any) -> SampleLayout:
        """The layout of ``sample``, whose leaves must be arrays or numbers."""
        if sample is None:
            raise ArgumentError("a collector needs init_sample to know the structure, shapes and dtypes of the samples")
        paths, leaves, treedef = flatten_with_paths(sample)
        shapes, dtypes = [], []
        for path, leaf in zip(paths, leaves, strict=True):
            dtype = getattr(leaf, "dtype", None)
            if dtype is None and isinstance(leaf, bool | int | float | complex):
                dtype = jnp.asarray(leaf).dtype
            if dtype is None or jnp.issubdtype(dtype, jax.dtypes.prng_key):
                raise ArgumentError(
                    f"sample leaf {path!r} is {leaf!r}; samples must be arrays or numbers "
                    "(store a PRNG key as jax.random.key_data(key))"
                )
            shapes.append(tuple(int(size) for size in np.shape(leaf)))
            dtypes.append(np.dtype(dtype))
        names = joined_names(pytree_dict_keys(sample), "/")
        return cls(treedef, names, shapes, dtypes)

    def problems_with(self, held: Mapping[str, np.ndarray]) -> list[str]:
        """How the arrays ``held`` by name (a chain's samples kept before) differ from the samples of this layout.

        >>> import numpy as np
        >>> layout = SampleLayout.of({"x": np.zeros(2, np.float32)})
        >>> layout.problems_with({"x": np.zeros((3, 2), np.int32), "y": np.zeros(3)})
        ["'x': held as int32[*, 2], the run samples float32[*, 2]", "'y': held, the run does not sample it"]
        """
        problems = []
        for name, shape, dtype in zip(self.names, self.shapes, self.dtypes, strict=True):
            found = held.get(name)
            if found is None:
                problems.append(f"{name!r}: the run samples {_rows_of(dtype, shape)}, not held")
            elif found.shape[1:] != shape or found.dtype != dtype:
                now = _rows_of(found.dtype, found.shape[1:])
                problems.append(f"{name!r}: held as {now}, the run samples {_rows_of(dtype, shape)}")
        problems += [f"{name!r}: held, the run does not sample it" for name in held if name not in self.names]
        return problems

    @property
    def row_bytes(self) -> int:
        """The bytes of one sample."""
        return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in zip(self.shapes, self.dtypes, strict=True))


def _rows_of(dtype: np.dtype[Any], shape: tuple[int, ...]) -> str:
    return f"{dtype}[{', '.join(['*', *map(str, shape)])}]"


class ChainBook:
    """Per chain: the sample layout, how many rows have arrived, the checkpoint resumed from; and the data loader.

    Chain ids count up from 0 and are never given twice, so that a later run of the same collector gets chains of its
    own; :meth:`drop` forgets a chain whose run is over.
    """

    def __init__(self) -> None:
        self.layouts: dict[int, SampleLayout] = {}
        self.ends: dict[int, int] = {}
        #: The spans of rows ``[first, end)`` that arrived, merged where they arrived in order.
        self.arrived: dict[int, list[tuple[int, int]]] = {}
        self.resumed: dict[int, ChainCheckpoint] = {}
        self.data_loader: DataLoader | None = None
        self.next_id = 0  # the id of the next chain registered: the number registered so far

    def add(self, layout: SampleLayout, resumed: ChainCheckpoint | None) -> int:
        """Register a chain (continuing from ``resumed`` if given) and return its id, :attr:`next_id`."""
        chain_id = self.next_id
        self.next_id += 1
        self.layouts[chain_id] = layout
        self.ends[chain_id] = 0 if resumed is None else resumed.sample_count
        self.arrived[chain_id] = [(0, self.ends[chain_id])]  # the rows of a run resumed are there already
        if resumed is not None:
            self.resumed[chain_id] = resumed
        return chain_id

    def drop(self, chain_id: int) -> None:
        """Forget the chain: its run is over."""
        for book in (self.layouts, self.ends, self.arrived, self.resumed):
            book.pop(chain_id, None)

    def layout(self, chain_id: int) -> SampleLayout:
        """The chain's layout; a chain not registered, or whose run is over, is an :class:`ArgumentError`."""
        layout = self.layouts.get(chain_id)
        if layout is None:
            over = 0 <= chain_id < self.next_id
            what = "ran already: its run is over and its samples were handed over" if over else "is not registered"
            raise ArgumentError(f"chain {chain_id} {what}; register a chain (init_save) for every run")
        return layout

    def received(self, chain_id: int, first: int, values: Sequence[np.ndarray]) -> int:
        """Note that rows ``first, ...`` of ``values`` arrived (checking their shapes and dtypes); return the end of
        the block. A dtype other than the chain's is refused, not cast: the states of chains whose samples differ in
        dtype, stacked into one, carry the widest of them."""
        layout = self.layout(chain_id)
        rows = len(values[0]) if values else 0
        for name, shape, dtype, value in zip(layout.names, layout.shapes, layout.dtypes, values, strict=True):
            if value.shape != (rows, *shape):
                raise ArgumentError(
                    f"chain {chain_id}: block for leaf {name!r} has shape {value.shape}, expected {(rows, *shape)}"
                )
            if value.dtype not in (dtype, jax.dtypes.canonicalize_dtype(dtype)):  # float64 sampled as jax's float32
                raise ArgumentError(
                    f"chain {chain_id}: block for leaf {name!r} holds {value.dtype} values, but the chain's init_save "
                    f"was given {dtype} ones: states of chains made from samples of other dtypes were stacked into "
                    "one, which holds the widest; give every chain's init_save samples of the same dtypes"
                )
        end = first + rows
        self.ends[chain_id] = max(self.ends[chain_id], end)
        spans = self.arrived[chain_id]
        if spans and spans[-1][0] <= first <= spans[-1][1]:  # in order, or again: one span
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((first, end))
        return end

    def trim(self, chain_id: int, count: int) -> None:
        """Keep the chain's first ``count`` rows only: the rest arrived from no sample of the run (see
        :meth:`~jaxstow.io.DataCollector.trim_chains`)."""
        self.layout(chain_id)
        if count > self.ends[chain_id]:
            raise CollectorError(
                f"chain {chain_id} kept {count} samples, but only {self.ends[chain_id]} reached the collector"
            )
        self.refuse_gaps(chain_id, count)
        self.ends[chain_id] = count

    def refuse_gaps(self, chain_id: int, count: int) -> None:
        """A :class:`CollectorError` if some of the chain's first ``count`` rows never arrived: storage reused from
        an earlier run holds that run's samples there."""
        missing = _first_gap(self.arrived[chain_id], count)
        if missing is not None:
            raise CollectorError(
                f"chain {chain_id}: its samples {missing[0]} to {missing[1] - 1} never reached the collector: give "
                "postprocess_save the saving state that the run's last call of save returned (driving a collector "
                f"by hand: save every row below {count} first)"
            )

    def with_loader_state(self, chain_id: int, checkpoint: ChainCheckpoint) -> ChainCheckpoint:
        """``checkpoint`` with the registered data loader's current state for the chain."""
        if self.data_loader is None:
            return checkpoint
        return checkpoint._replace(data_loader_state=self.data_loader.save_state(chain_id))

    def resume(self) -> dict[int, ChainCheckpoint]:
        """Give the data loader back its checkpointed states; the resumed checkpoints by chain id."""
        if self.data_loader is not None:
            for chain_id, checkpoint in self.resumed.items():
                if checkpoint.data_loader_state is not None:
                    self.data_loader.load_state(chain_id, checkpoint.data_loader_state)
        return dict(self.resumed)


class KeepsChains:
    """What the built-in collectors share: a :class:`ChainBook` of their chains, which holds the data loader too."""

    _chains: ChainBook
    _stopped: StoppedRun  # the chains of a stopped run that the run registered now continues

    def refuse_missing_chains(self) -> None:
        """A :class:`CollectorError` if the chains registered continue a stopped run without all of its chains:
        checked at each block, checkpoint and end of the run, and by :func:`jaxstow.io.save` when the run is traced,
        before it computes anything (no chain registered: no run goes on, none to refuse)."""
        if self._chains.layouts:
            self._stopped.refuse_fewer(self._chains.layouts)

    def register_data_loader(self, data_loader: DataLoader) -> None:
        """Register a data loader whose state is checkpointed with the chains."""
        self._chains.data_loader = data_loader

    def trim_chains(self, counts: Mapping[int, int]) -> None:
        """Keep each chain's first ``counts[chain_id]`` samples only (see :meth:`~jaxstow.io.DataCollector.trim_chains`)."""
        for chain_id, count in counts.items():
            self._chains.trim(chain_id, count)


def _stored(checkpoint: ChainCheckpoint, chain_id: int) -> dict[str, Any]:
    """A checkpoint as it is written: the solver state as its list of leaves (its structure is the run's) and their
    paths, which a resumed run's must match; and the chain it belongs to."""
    paths, leaves, _ = flatten_with_paths(checkpoint.solver_state)
    return {**checkpoint._asdict(), "solver_state": leaves, _PATHS: paths, _CHAIN: chain_id}


def write_checkpoint(
    path: str, checkpoint: ChainCheckpoint, samples: dict[str, np.ndarray] | None = None, *, chain_id: int
) -> None:
    """Write chain ``chain_id``'s ``checkpoint`` (and optionally the samples kept so far) to ``path`` atomically."""
    save(path, {"checkpoint": _stored(checkpoint, chain_id), "samples": samples})


def write_checkpoints(
    path: str,
    checkpoints: Mapping[int, ChainCheckpoint],
    kept: Mapping[int, dict[str, Any]] | None = None,
    run: str | None = None,
) -> None:
    """Write the checkpoints of several chains to ``path`` atomically, as one file, with the records ``kept`` as
    :func:`read_checkpoints` read them (those of a stopped run's chains that no run has continued yet), and ``run``,
    the run id of the file of samples they count (:data:`~jaxstow.io.hdf5_layout.RUN_ID`), if it has one."""
    stored = {chain_id: _stored(checkpoint, chain_id) for chain_id, checkpoint in checkpoints.items()}
    save(path, {"chains": {**(kept or {}), **stored}, **({} if run is None else {"run": run})})


def read_checkpoint(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray] | None] | None:
    """The checkpoint record stored at ``path`` by :func:`write_checkpoint` and its samples, or ``None``."""
    if not os.path.exists(path):
        return None
    with read_while_tracing():  # init_save may run under jit or vmap: the checkpoint is the traced program's start
        checkpoint = load(path, select=["checkpoint"])["checkpoint"]
        samples = load(path, select=["samples"], as_numpy=True)["samples"]  # the host's: never traced values
    return checkpoint, None if samples is None else {name: np.asarray(a) for name, a in samples.items()}


def read_checkpoints(path: str, run: str | None = None, *, samples: str = "") -> dict[int, dict[str, Any]]:
    """The checkpoint records stored at ``path`` by :func:`write_checkpoints`, by chain id (none if no file).

    Records written for the file of samples of another run than ``run`` (the run id of ``samples``, where both are
    known) are a :class:`~jaxstow.errors.CollectorError`: another run's checkpoint, copied or left beside the file,
    would continue its chains from that run's states, at that run's counts.
    """
    if not os.path.exists(path):
        return {}
    with read_while_tracing():
        saved = load(path)
    written_for = saved.get("run")
    if run is not None and written_for is not None and written_for != run:
        raise CollectorError(
            f"{path} holds the checkpoints of another run than {samples} (run {written_for} there, {run} in the "
            "file): it was copied or left there from another run's folder; put the file's own checkpoint back to "
            "continue its run, or move both away to start over",
            file=path,
        )
    return {int(chain_id): record for chain_id, record in saved["chains"].items()}


def restore_checkpoint(record: dict[str, Any], init_checkpoint: Any, *, chain_id: int, file: str) -> ChainCheckpoint:
    """A stored record as a :class:`ChainCheckpoint` whose solver state has the structure of ``init_checkpoint``.

    A stored state with other leaves, shapes or dtypes raises a :class:`~jaxstow.errors.StructureMismatchError`
    naming ``file`` and every leaf that differs: nothing is resumed from it.
    """
    paths, wanted, treedef = flatten_with_paths(init_checkpoint)
    record = dict(record)
    stored, stored_paths, owner = list(record.pop("solver_state")), record.pop(_PATHS, None), record.pop(_CHAIN, None)
    what = f"checkpointed solver state of chain {chain_id}"
    if owner is not None and owner != chain_id:  # a chain's file copied or moved over another's
        problems = [f"the checkpoint of chain {chain_id} holds the state of chain {owner}"]
    elif len(stored) != len(wanted):
        problems = [f"{what} has {len(stored)} leaves, the run's has {len(wanted)} ({', '.join(paths) or 'none'})"]
    elif stored_paths is not None and list(stored_paths) != paths:  # a field renamed: never matched by position
        problems = [f"{what} has the leaves {list(stored_paths)}, the run's are {paths}"]
    else:
        problems = [
            f"{what} leaf {path!r} is {_kind(leaf)}, expected {_kind(want)}"
            for path, leaf, want in zip(paths, stored, wanted, strict=True)
            if _kind(leaf) != _kind(want)
        ]
    if problems:
        moved = owner is not None and owner != chain_id  # not another run's state: another chain's file
        raise StructureMismatchError(problems if moved else [*problems, OTHER_RUN], file=file)
    return ChainCheckpoint(**record, solver_state=treedef.unflatten(stored))


#: What to do about a stopped run whose samples or solver state differ from those of the run that continues it.
OTHER_RUN = (
    "the stopped run was started with other samples or another solver state: continue it with those, or move its "
    "samples and checkpoints away together to start over (its samples without their checkpoints cannot be continued)"
)


#: The record's members besides the :class:`ChainCheckpoint`'s fields: the solver state's paths, and the chain.
_PATHS, _CHAIN = "solver_paths", "chain"


def _kind(leaf: Any) -> str:
    return f"{jnp.result_type(leaf)}{list(np.shape(leaf))}"


def remove_checkpoint(path: str) -> None:
    """Delete the checkpoint at ``path``, if any: the run it belongs to is complete."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _first_gap(spans: list[tuple[int, int]], count: int) -> tuple[int, int] | None:
    """The first rows ``[start, end)`` below ``count`` that no span covers, or ``None``."""
    covered = 0
    for first, end in sorted(spans):
        if first > covered:
            return covered, min(first, count)
        covered = max(covered, end)
        if covered >= count:
            return None
    return (covered, count) if covered < count else None
