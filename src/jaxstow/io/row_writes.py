"""Which delivery wrote the rows a collector holds of each chain, to tell one run's samples from a mix of two.

A run delivers its chain's blocks in row order (a block may come again, whole after a part of it); two runs that go on
from one saving state deliver the same rows twice, the second run's later. Rows are kept as runs of rows written in
order, each with the number of the latest delivery into it: a chain's rows hold one run's samples while those numbers
never fall from row to row.

>>> writes = RowWrites()
>>> [writes.note(7, first, count) for first, count in [(0, 4), (4, 4), (8, 2), (8, 4)]]  # a block in part, then whole
[None, None, None, None]
>>> writes.mixed(7, 12)
False
>>> writes.note(7, 0, 4)                                     # another run from the same state: rows 0..3 again
(12, 8)
>>> writes.mixed(7, 12), writes.mixed(7, 4)
(True, False)
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from jaxstow.errors import CollectorError

__all__ = ["RowWrites", "same_bytes"]


@dataclasses.dataclass
class _Rows:
    start: int
    end: int
    delivery: int


class RowWrites:
    """The rows delivered of each chain, as runs of rows with the number of the latest delivery into each."""

    def __init__(self) -> None:
        self._rows: dict[int, list[_Rows]] = {}
        self._last_first: dict[int, int] = {}
        self._last_delivery: dict[int, int] = {}
        self._deliveries = 0

    def note(self, chain_id: int, first: int, count: int) -> tuple[int, int] | None:
        """Note a delivery of ``count`` rows of chain ``chain_id`` from row ``first``; where it goes back, starting
        before the chain's last delivery did (another run from an earlier saving state began, or another branch of a
        ``lax.cond``), the end of the rows delivered before it and the first row of that last delivery."""
        if count <= 0:
            return None
        last_first = self._last_first.get(chain_id, first)
        went_back_from = (self.end(chain_id), last_first) if first < last_first else None
        self._deliveries += 1
        end = first + count
        rows = self._rows.setdefault(chain_id, [])
        last = rows[-1] if rows else None
        if last is not None and last.delivery == self._last_delivery[chain_id] and last.end == first:
            last.end, last.delivery = end, self._deliveries  # the next block of a run: the common case, at once
            self._last_first[chain_id], self._last_delivery[chain_id] = first, self._deliveries
            return None
        kept = [_Rows(part.start, min(part.end, first), part.delivery) for part in rows if part.start < first]
        kept += [_Rows(max(part.start, end), part.end, part.delivery) for part in rows if part.end > end]
        new = _Rows(first, end, self._deliveries)
        kept = sorted((part for part in [*kept, new] if part.end > part.start), key=lambda part: part.start)
        at = kept.index(new)
        before = kept[at - 1] if at else None
        on_from_last = before is not None and before.delivery == self._last_delivery.get(chain_id)
        if on_from_last and before is not None and before.end == first >= self._last_first[chain_id]:
            before.end, before.delivery = end, self._deliveries  # on from the run's last block: one run of rows
            del kept[at]
        rows[:] = kept
        self._last_first[chain_id], self._last_delivery[chain_id] = first, self._deliveries
        return went_back_from

    def mixed(self, chain_id: int, count: int) -> bool:
        """Whether the first ``count`` rows of the chain were written by deliveries of more than one run."""
        deliveries = [part.delivery for part in self._rows.get(chain_id, []) if part.start < count]
        return any(later < earlier for earlier, later in itertools.pairwise(deliveries))

    def refuse_mixed(self, chain_id: int, count: int, collector: str) -> None:
        """A :class:`CollectorError` if the chain's first ``count`` rows (a final state's) are a mix of two runs'
        (:meth:`mixed`); the chain is forgotten either way."""
        mixed = self.mixed(chain_id, count)
        self.forget(chain_id)
        if mixed:
            raise CollectorError(
                f"the {collector} holds samples of chain {chain_id} from two runs: another run went on from the same "
                "saving state and sent its samples after this one (s1 = run(state); s2 = run(state); "
                "postprocess_save(s1)), over some of this run's: call init_save for each run"
            )

    def end(self, chain_id: int) -> int:
        """The end of the rows delivered of the chain (0: none)."""
        return max((part.end for part in self._rows.get(chain_id, [])), default=0)

    def forget(self, chain_id: int) -> None:
        """Forget the chain (its run is over)."""
        self._rows.pop(chain_id, None)
        self._last_first.pop(chain_id, None)
        self._last_delivery.pop(chain_id, None)


def same_bytes(one: Any, other: np.ndarray) -> bool:
    """Whether the rows a collector kept (``one``) hold the same bytes as the run's (``other``, of one dtype): a NaN is
    its own equal, and ``-0.0`` not ``0.0``; neither is copied where it is contiguous.

    >>> same_bytes(np.array([np.nan, 0.0]), np.array([np.nan, 0.0])), same_bytes(np.array([-0.0]), np.array([0.0]))
    (True, False)
    """
    return np.array_equal(np.ascontiguousarray(one).view(np.uint8), np.ascontiguousarray(other).view(np.uint8))
