"""Which steps a checkpoint directory keeps: the latest k, every n-th, one per time interval, the best k by a metric.

A step is kept if any rule keeps it, and the newest step is always kept, so that a run can resume from it until a
newer one is committed. With no rule at all, every step is kept. ``keep_every_seconds`` keeps the oldest step, then
each step saved at least that long after the last one it kept.

>>> from jaxstow._steps.keep import KeepPolicy
>>> policy = KeepPolicy(keep_last=2, keep_every=10, keep_best=1, metric="loss")
>>> steps = [5, 10, 15, 20, 25, 30]
>>> losses = {5: 0.9, 10: 0.5, 15: 0.1, 20: 0.3, 25: 0.4, 30: 0.6}
>>> sorted(policy.keep(steps, losses)), policy.to_delete(steps, losses)
([10, 15, 20, 25, 30], [5])
>>> hourly = KeepPolicy(keep_last=1, keep_every_seconds=3600)
>>> hourly.to_delete([1, 2, 3, 4], {}, times={1: 0.0, 2: 1800.0, 3: 3700.0, 4: 4000.0})
[2]
"""

from __future__ import annotations

import datetime
import math
import numbers
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from jaxstow._util.counts import count
from jaxstow.errors import ArgumentError, excerpt

__all__ = ["KeepPolicy"]


@dataclass(frozen=True)
class KeepPolicy:
    """Retention rules: a step is kept if any rule keeps it, the newest step always; with no rule, every step.

    Args:
        keep_last: the ``keep_last`` newest steps.
        keep_every: the steps that are multiples of ``keep_every``.
        keep_best: the ``keep_best`` steps with the best value of ``metric`` among the metrics saved with them.
        metric: the name of the metric that ``keep_best`` ranks by.
        mode: ``"min"``: the lowest value is best; ``"max"``: the highest.
        keep_every_seconds: one step per interval of save time (seconds, or a ``datetime.timedelta``, stored as
            seconds), as orbax's ``keep_time_interval`` does.

    Raises:
        ArgumentError: a value out of range or of the wrong type, or ``keep_best`` without ``metric``.

    >>> from jaxstow import KeepPolicy
    >>> KeepPolicy(keep_last=2, keep_every=10).to_delete([5, 10, 15, 20, 25], {})
    [5, 15]
    """

    keep_last: int | None = None
    keep_every: int | None = None
    keep_best: int | None = None
    metric: str | None = None
    mode: Literal["min", "max"] = "min"
    keep_every_seconds: float | datetime.timedelta | None = None

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_every", "keep_best"):
            if (value := getattr(self, name)) is not None:
                object.__setattr__(self, name, count(value, name, or_none=True))
        given = self.keep_every_seconds
        interval = given.total_seconds() if isinstance(given, datetime.timedelta) else given
        if interval is not None and (
            isinstance(interval, bool)
            or not isinstance(interval, numbers.Real)
            or not 0 < (interval if isinstance(interval, int) else float(interval)) < sys.float_info.max
        ):
            raise ArgumentError(
                "keep_every_seconds must be a positive number of seconds, a positive datetime.timedelta or None, "
                f"not {given!r}"
            )
        if interval is not None:
            object.__setattr__(self, "keep_every_seconds", float(interval))
        if self.metric is not None and not isinstance(self.metric, str):
            raise ArgumentError(f"metric must be the name of a metric (a string) or None, not {excerpt(self.metric)}")
        if self.mode not in ("min", "max"):
            raise ArgumentError(f'mode must be "min" or "max", not {self.mode!r}')
        if self.keep_best is not None and not self.metric:
            raise ArgumentError("keep_best ranks steps by a metric: name it with metric=..., e.g. metric='loss'")

    def __str__(self) -> str:
        """The rules in words: ``keep_last=2, keep_best=1 by loss (min)``."""
        rules = [f"keep_last={self.keep_last}"] if self.keep_last else []
        rules += [f"keep_every={self.keep_every}"] if self.keep_every else []
        rules += [f"keep_every_seconds={self.interval:g}"] if self.interval else []
        rules += [f"keep_best={self.keep_best} by {self.metric} ({self.mode})"] if self.keep_best else []
        return ", ".join(rules) or "none (every step is kept)"

    @property
    def ranks(self) -> bool:
        """Whether the policy needs each step's metric."""
        return self.keep_best is not None

    @property
    def times(self) -> bool:
        """Whether the policy needs the time each step was saved."""
        return self.keep_every_seconds is not None

    @property
    def interval(self) -> float | None:
        """``keep_every_seconds`` in seconds."""
        return cast(float | None, self.keep_every_seconds)

    def keep(
        self, steps: Sequence[int], metrics: Mapping[int, float | None], times: Mapping[int, float] | None = None
    ) -> set[int]:
        """The steps to keep.

        ``metrics`` maps steps to their metric (``None`` or NaN ranks last), ``times`` to the time they were saved (in
        seconds; a step without one is kept by no time rule).
        """
        return {step for step, rules in self.reasons(steps, metrics, times).items() if rules}

    def reasons(
        self, steps: Sequence[int], metrics: Mapping[int, float | None], times: Mapping[int, float] | None = None
    ) -> dict[int, list[str]]:
        """The rules that keep each step.

        Such as ``"last 3"``, ``"every 100"``, ``"every 3600 s"``, ``"best 1 by loss"``, ``"newest"``.

        A step with no rule is one the policy deletes.

        >>> from jaxstow._steps.keep import KeepPolicy
        >>> KeepPolicy(keep_last=1, keep_every=10).reasons([10, 15, 20], {})
        {10: ['every 10'], 15: [], 20: ['last 1', 'every 10']}
        """
        ordered = sorted(steps)
        reasons: dict[int, list[str]] = {step: [] for step in ordered}
        if not ordered:
            return reasons
        if self.keep_last is None and self.keep_every is None and self.keep_best is None and not self.times:
            return {step: ["no keep rule"] for step in ordered}
        if self.keep_last is not None:
            for step in ordered[-self.keep_last :]:
                reasons[step].append(f"last {self.keep_last}")
        if self.keep_every is not None:
            for step in ordered:
                if step % self.keep_every == 0:
                    reasons[step].append(f"every {self.keep_every}")
        if self.interval is not None:
            for step in _one_per_interval(ordered, times or {}, self.interval):
                reasons[step].append(f"every {self.interval:g} s")
        if self.keep_best is not None:
            for step in sorted(ordered, key=lambda step: self._rank(metrics.get(step), step))[: self.keep_best]:
                reasons[step].append(f"best {self.keep_best} by {self.metric}")
        if not reasons[ordered[-1]]:
            reasons[ordered[-1]].append("newest")
        return reasons

    def best(self, metrics: Mapping[int, float | None]) -> int | None:
        """The step with the best metric (the newest of equals), or ``None`` if no step has a usable one.

        >>> KeepPolicy(keep_best=1, metric="loss", mode="max").best({1: 0.5, 2: None, 3: 0.7, 4: float("nan")})
        3
        """
        usable = [step for step, value in metrics.items() if value is not None and not math.isnan(value)]
        return min(usable, key=lambda step: self._rank(metrics[step], step)) if usable else None

    def to_delete(
        self, steps: Sequence[int], metrics: Mapping[int, float | None], times: Mapping[int, float] | None = None
    ) -> list[int]:
        """The steps that no rule keeps, oldest first."""
        kept = self.keep(steps, metrics, times)
        return [step for step in sorted(steps) if step not in kept]

    def _rank(self, value: float | None, step: int) -> tuple[bool, float, int]:
        """Sort key: steps without a usable value last; ties go to the newer step."""
        if value is None or math.isnan(value):
            return (True, 0.0, -step)
        return (False, value if self.mode == "min" else -value, -step)


def _one_per_interval(steps: Sequence[int], times: Mapping[int, float], interval: float) -> list[int]:
    """The oldest step with a time, then each step saved at least ``interval`` seconds after the last one taken, or
    before it: a clock set back (a host whose clock ran ahead, corrected) starts the intervals again from there.

    >>> _one_per_interval([1, 2, 3, 4, 5, 6], {1: 0, 2: 30, 3: 60, 4: 10, 5: 40, 6: 70}, 60)
    [1, 3, 4, 6]
    """
    taken: list[int] = []
    for step in steps:
        time = times.get(step)
        if time is not None and (not taken or not 0 <= time - times[taken[-1]] < interval):
            taken.append(step)
    return taken
