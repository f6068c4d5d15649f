"""The runs of a chain that a later run from the same saving state wrote over, to tell which run a final state is of.

Two calls of a compiled run from one initial state (a warm-up call, then the run; or the loops in both branches of a
per-chain ``lax.cond``, which ``vmap`` runs one after the other) send the same rows twice, and the collector keeps the
later call's. The final state of either call is told from the other by the last block it sent, which the host holds
against the rows kept; where the calls' samples differ only before that block, the state could be either. The host
then keeps, as the later call starts to write over the earlier one's rows, that call's last rows and whether the
samples written over differ, and refuses a final state that could be the earlier call's.

>>> import numpy as np
>>> class Kept:                                         # a collector that reads back the rows it keeps
...     rows = {0: [np.arange(8.0)]}                    # chain 0: one leaf, 8 rows
...     def _kept_rows(self, chain_id, first, count):
...         return [leaf[first : first + count] for leaf in self.rows[chain_id]]
>>> displaced = DisplacedRuns()                         # a second call sends rows 0..1 again, with row 0 other
>>> displaced.before_write(Kept(), 0, first=0, values=[np.array([-1.0, 1.0])], went_back_from=(8, 6))
>>> displaced.refuse_other_rows(0, 8, [(6, slice(0, 2))], [np.array([6.0, 7.0])], Kept.rows[0], "Kept")
Traceback (most recent call last):
jaxstow.errors.CollectorError: the Kept holds samples of chain 0 that another run ...: it could be of either ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from jaxstow.errors import CollectorError
from jaxstow.io.row_writes import same_bytes

__all__ = ["DisplacedRuns"]

Rows = list[np.ndarray] | None  # a block's rows, one array per leaf; None: the collector cannot read them back
#: The earlier calls whose last rows are kept, per chain: the latest (branches of a lax.cond go back at every block).
_TAILS_KEPT = 8


@dataclasses.dataclass
class _Chain:
    settled: int = 0  # the rows the earlier calls had sent before their last block
    #: Where each of the latest earlier calls ended, with its last rows, copied once a later call differs.
    tails: dict[int, tuple[int, Rows]] = dataclasses.field(default_factory=dict)
    differs: bool = False  # whether a later call's samples differ from the rows they were written over


class DisplacedRuns:
    """Per chain, the calls that a later call from the same saving state wrote over."""

    def __init__(self) -> None:
        self._chains: dict[int, _Chain] = {}

    def before_write(
        self,
        collector: Any,
        chain_id: int,
        *,
        first: int,
        values: Sequence[np.ndarray],
        went_back_from: tuple[int, int] | None,
    ) -> None:
        """Note the block ``values`` from row ``first`` before ``collector`` writes it; ``went_back_from``: it starts
        before the chain's last block did (another call began), where the chain's rows ended and that block began.

        Only rows before that last block are held against what they held: the rows of a block being filled, which
        both branches of a ``lax.cond`` send at a checkpoint, each its own, are sent again whole once it is full.
        """
        count = len(values[0]) if values else 0
        if went_back_from is not None and count:
            chain = self._chains.setdefault(chain_id, _Chain())
            end, settled = went_back_from
            chain.tails.pop(end, None)
            chain.tails[end] = (max(0, end - 2 * count), None)  # a final state shows a block or two of its last rows
            if len(chain.tails) > _TAILS_KEPT:
                del chain.tails[next(iter(chain.tails))]
            chain.settled = max(chain.settled, settled)
        known = self._chains.get(chain_id)
        over = 0 if known is None else min(first + count, known.settled) - first
        if known is None or known.differs or over <= 0:
            return
        old = _kept(collector, chain_id, first, over)
        if old is None or len(old) != len(values) or not all(map(same_bytes, old, [value[:over] for value in values])):
            known.differs = True  # the earlier calls' last rows are still theirs: kept before any is written over
            for end, (start, _) in known.tails.items():
                known.tails[end] = (start, _kept(collector, chain_id, start, end - start))

    def refuse_other_rows(
        self,
        chain_id: int,
        sent: int,
        pieces: Sequence[tuple[int, slice]],
        ring: Sequence[Any],
        kept: Sequence[Any],
        collector: str,
    ) -> None:
        """A :class:`~jaxstow.errors.CollectorError` if the rows ``kept`` of the chain are not those of the final state
        whose ``ring`` holds, at ``pieces``, its last rows sent (before row ``sent``), or if it could be of a call that a
        later one wrote over with other samples; the chain is forgotten either way."""
        chain = self._chains.pop(chain_id, None)
        if not pieces or len(kept) != len(ring):
            return
        for rows, held in zip(kept, ring, strict=True):
            if getattr(rows, "dtype", None) != held.dtype or len(rows) < sent:
                return  # a collector of its own that gives other samples than it got
            if not all(same_bytes(rows[first : first + len(held[part])], held[part]) for first, part in pieces):
                raise CollectorError(
                    f"the {collector} holds other samples of chain {chain_id} than this run's final state: another "
                    "run went on from the same saving state and sent its samples after this one (s1 = run(state); "
                    "s2 = run(state); postprocess_save(s1)), or save sits in loops of their own in the branches of a "
                    "per-chain lax.cond, which vmap runs for every chain; the samples of the run that ran last are "
                    "kept: to keep both, call init_save for each run, and call save once, after the lax.cond"
                )
        if chain is not None and chain.differs and _ends_as_one_of(chain.tails.values(), pieces, ring):
            raise CollectorError(
                f"the {collector} holds samples of chain {chain_id} that another run from the same saving state sent "
                "over other ones, and this final state ends as both runs did: it could be of either (s1 = run(state); "
                "s2 = run(state)), or of either branch of a per-chain lax.cond that calls save in loops of its own; "
                "call init_save for each run, and save once, after the lax.cond"
            )

    def forget(self, chain_id: int) -> None:
        """Forget the chain (its run is over)."""
        self._chains.pop(chain_id, None)


def _kept(collector: Any, chain_id: int, first: int, count: int) -> Rows:
    """The rows ``collector`` keeps of the chain from ``first``, copied; ``None`` if it cannot read them back."""
    read = getattr(collector, "_kept_rows", None)
    try:
        rows = None if read is None else read(chain_id, first, count)
    except Exception:  # a collector that fails to read them back (its writer failed: its save says so)
        rows = None
    return None if rows is None else [np.array(leaf) for leaf in rows]


def _ends_as_one_of(
    tails: Iterable[tuple[int, Rows]], pieces: Sequence[tuple[int, slice]], ring: Sequence[Any]
) -> bool:
    """Whether a final state whose ``ring`` holds its last rows sent at ``pieces`` ends as one of the earlier calls'
    ``tails`` did (``True`` where a collector could not read one back)."""
    for start, tail in tails:
        if not tail:  # rows the collector cannot read back
            return True
        inside = all(
            start <= first and first + part.stop - part.start <= start + len(tail[0]) for first, part in pieces
        )
        if inside and all(
            same_bytes(rows[first - start : first - start + part.stop - part.start], held[part])
            for rows, held in zip(tail, ring, strict=True)
            for first, part in pieces
        ):
            return True
    return False
