"""What a sampling run knows before it starts.

>>> from jaxstow import scheduler
>>> scheduler.static_information(samples_collected=3)
static_information(samples_collected=3)
>>> scheduler.static_information().samples_collected is None
True
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["static_information"]


class static_information(NamedTuple):
    """Information that is constant during a run.

    ``samples_collected`` is the number of samples the run will keep per chain, or ``None`` when it is not known in
    advance: storage then grows as samples arrive.
    """

    samples_collected: int | None = None
