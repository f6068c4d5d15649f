"""The errors of :mod:`jaxstow.io`; like every jaxstow error they derive from :class:`jaxstow.errors.JaxstowError`.

>>> from jaxstow.io.errors import SampleCountError
>>> print(SampleCountError([(0, 7, 5)], "declare the right number"))
chain 0 kept 7 samples, but static_information declared samples_collected=5; declare the right number
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxstow.errors import JaxstowError

__all__ = ["CollectorError", "SampleCountError"]


class CollectorError(JaxstowError, RuntimeError):
    """A data collector failed during a run (disk full, closed file, ...); the collector's exception is the cause."""


class SampleCountError(JaxstowError, ValueError):
    """Chains kept more samples than ``static_information.samples_collected`` declared.

    ``overflows`` lists ``(chain, kept, declared)``; ``advice`` says what became of the extra samples and what to do.
    """

    def __init__(self, overflows: Sequence[tuple[int, int, int]], advice: str) -> None:
        chains = "; ".join(
            f"chain {chain} kept {kept} samples, but static_information declared samples_collected={declared}"
            for chain, kept, declared in overflows
        )
        super().__init__(f"{chains}; {advice}")
        self.overflows = list(overflows)
