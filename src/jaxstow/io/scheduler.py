"""What a sampling run knows before it starts.

>>> import jax.numpy as jnp
>>> from jaxstow import scheduler
>>> scheduler.static_information(samples_collected=3)
static_information(samples_collected=3)
>>> scheduler.static_information().samples_collected is None
True
>>> keep = jnp.array([True, False, True])
>>> scheduler.static_information(samples_collected=jnp.sum(keep))      # any integer, counted on the device or not
static_information(samples_collected=2)
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

from jaxstow._util.arguments import checked_arguments
from jaxstow.errors import ArgumentError

__all__ = ["static_information"]


class _Fields(NamedTuple):
    samples_collected: int | None = None


class static_information(_Fields):
    """Information that is constant during a run.

    ``samples_collected`` is the number of samples the run will keep per chain, or ``None`` when it is not known in
    advance: storage then grows as samples arrive. A Python, numpy or jax integer (a 0-d integer array) is taken
    and kept as a Python ``int``.
    """

    __slots__ = ()

    def __new__(cls, samples_collected: Any = None) -> static_information:
        return super().__new__(cls, _count(samples_collected))

    # A field of jax_sgmc's scheduler that this one lacks (thinning=) named with what it takes, not a bare TypeError.
    __new__ = checked_arguments(__new__, name="static_information")  # type: ignore[assignment]


def _count(samples_collected: Any) -> int | None:
    if samples_collected is None:
        return None
    if isinstance(samples_collected, bool):
        raise ArgumentError("samples_collected must be an integer or None, not a bool")
    try:
        count = operator.index(samples_collected)
    except TypeError:
        raise ArgumentError(
            f"samples_collected must be an integer (Python, numpy or a 0-d jax integer array) or None, "
            f"not {samples_collected!r}"
        ) from None
    if count < 0:
        raise ArgumentError(f"samples_collected must be at least 0, not {count}")
    return count
