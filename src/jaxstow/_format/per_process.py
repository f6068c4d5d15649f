"""Per-process leaves: a value each process of a multi-process save keeps for itself.

A ``per_process`` leaf is a :class:`PerProcess` wrapper, or a stateful iterator (anything with ``get_state()`` and
``set_state()``, such as a grain data iterator), whose state is saved. Each process's file holds its own value as a
tensor named by the leaf's path: the bytes of a jaxstow file of the value. Its entry says how many processes saved
the tree and which one wrote it (docs/format.md, "Per-process leaves").

>>> from jaxstow._format.per_process import PerProcess, is_per_process
>>> is_per_process(PerProcess({"epoch": 3})), is_per_process({"epoch": 3})
(True, False)
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jaxstow._format.tensor_reads import TensorSlot
from jaxstow.errors import ArgumentError, FormatError, excerpt

__all__ = [
    "PerProcess",
    "per_process",
    "check_per_process_entry",
    "held",
    "is_per_process",
    "is_stateful",
    "state_of",
    "states_put_back_on_failure",
]


class PerProcess:
    """A value saved separately for each process and restored to each process as its own, plain.

    ``iterator`` marks the state of a stateful iterator, taken when the save was asked for.
    """

    __slots__ = ("iterator", "value")

    def __init__(self, value: Any, *, iterator: bool = False) -> None:
        self.value = value
        self.iterator = iterator

    def __repr__(self) -> str:
        return f"per_process({self.value!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PerProcess) and _same(self.value, other.value)

    __hash__ = None  # type: ignore[assignment]


def per_process(value: Any) -> PerProcess:
    """Mark ``value`` to be saved separately by each process and restored to each process as its own.

    ``value`` is JSON data, numpy arrays and dicts and lists of them (a data loader's position, a host's RNG state).
    In a save by ``N`` processes each writes its own value; a restore by ``N`` processes gives process ``k`` the value
    process ``k`` saved, plain (not wrapped). With another number of processes the restore raises a
    :class:`~jaxstow.errors.RequestError` naming both counts, unless it asks for ``per_process="all"``: then the leaf is
    the list of every process's value. A stateful iterator (with ``get_state()`` and ``set_state()``, such as grain's)
    is saved by its state, wrapped or not, and restored into the live iterator ``like=`` holds at its place. See docs/scaling.md ("Per-process state").

    >>> import io, jaxstow
    >>> buffer = io.BytesIO()
    >>> jaxstow.save(buffer, {"step": 7, "loader": jaxstow.per_process({"epoch": 2, "index": 130})})
    >>> _ = buffer.seek(0)
    >>> jaxstow.load(buffer)
    {'loader': {'epoch': 2, 'index': 130}, 'step': 7}
    """
    return PerProcess(value)


def _same(first: Any, second: Any) -> bool:
    try:
        return bool(np.array_equal(first, second)) if isinstance(first, np.ndarray) else bool(first == second)
    except (TypeError, ValueError):
        return False


def is_stateful(leaf: Any) -> bool:
    """Whether ``leaf`` is an iterator (not a class) with ``get_state()`` and ``set_state()`` (grain's are)."""
    if isinstance(leaf, type):
        return False
    return callable(getattr(leaf, "get_state", None)) and callable(getattr(leaf, "set_state", None))


@contextlib.contextmanager
def states_put_back_on_failure(like: Any) -> Iterator[None]:
    """On an error, give each live iterator of ``like`` the state it had before (a restore that failed after it set
    some to the saved state: the caller may go on from where it was)."""
    try:
        leaves = jax.tree.leaves(like, is_leaf=is_per_process)
    except (TypeError, ValueError):  # a like jax cannot flatten: the restore names what is wrong, setting nothing
        leaves = []
    live = [leaf.value if isinstance(leaf, PerProcess) else leaf for leaf in leaves]
    before = [(iterator, iterator.get_state()) for iterator in live if is_stateful(iterator)]
    try:
        yield
    except BaseException:
        for iterator, state in before:
            iterator.set_state(state)
        raise


def is_per_process(leaf: Any) -> bool:
    """Whether ``leaf`` is saved per process: a :class:`PerProcess` or a stateful iterator."""
    return isinstance(leaf, PerProcess) or is_stateful(leaf)


def state_of(leaf: Any) -> Any:
    """The value to save for a per-process leaf: the wrapped value, or the iterator's state (wrapped or not), checked
    to hold no per-process leaf of its own (which could never be restored: a state is plain values)."""
    value = leaf.value if isinstance(leaf, PerProcess) else leaf
    state = value.get_state() if is_stateful(value) else value
    inner = [part for part in jax.tree.leaves(state, is_leaf=is_per_process) if is_per_process(part)]
    if inner:
        raise ArgumentError(
            f"a per-process value or a data iterator's state holds {type(inner[0]).__name__}, itself a per-process "
            "value or a data iterator, which could not be restored: give get_state() its inner iterators' states "
            "(their get_state()), plain arrays and values"
        )
    return state


def held(leaf: Any) -> PerProcess:
    """A per-process leaf as it is when a save is asked for: its value or state copied, kept from later changes."""
    iterator = not isinstance(leaf, PerProcess) or leaf.iterator or is_stateful(leaf.value)
    state = state_of(leaf)
    try:
        return PerProcess(copy.deepcopy(state), iterator=iterator)
    except (TypeError, copy.Error) as error:  # a memoryview, a lock: what no copy keeps from later changes
        raise ArgumentError(
            f"a per-process value or a data iterator's state of type {type(state).__name__} cannot be copied when the "
            f"save is asked for ({error}): give it plain arrays, numbers, strings and bytes"
        ) from None


def check_per_process_entry(entry: dict[str, Any], slot: TensorSlot | None, *, file: str) -> None:
    """Raise :class:`FormatError` unless ``entry`` is a valid ``per_process`` entry over its tensor ``slot``."""
    path = entry["path"]
    processes, process = entry.get("processes"), entry.get("process")
    if not (type(processes) is int and type(process) is int and 0 <= process < processes):
        raise FormatError(
            f"a per_process leaf needs its processes and process (0 <= process < processes), not "
            f"{excerpt(processes)} and {excerpt(process)}",
            file=file,
            path=path,
        )
    if slot is None or slot.dtype != np.uint8 or len(slot.shape) != 1:
        raise FormatError(
            "a per_process leaf needs a one-dimensional U8 tensor named by its path", file=file, path=path
        )
    if "iterator" in entry and type(entry["iterator"]) is not bool:
        raise FormatError(f"malformed iterator flag {excerpt(entry['iterator'])}", file=file, path=path)
