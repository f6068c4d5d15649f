"""The chains of a run that stopped before it finished (killed, or stopped by hand), whose checkpoints a built-in
collector continues: the run that continues it has every one of those chains, or one alone (jax_sgmc's one chain per
call, as a first run may go too), the others keeping their checkpoints for the collector's next runs, which continue
them in turn. A run of several chains but not all would leave the others behind, most likely by mistake (a collector
made anew numbers its chains from 0: it cannot go on with them once the first are finished); a run of more would
start its other chains from nothing beside chains well on their way.

A chain that the stopped run lacks is refused when it registers, before anything is written for it; a run that lacks
some of the stopped run's chains, when the function that calls ``save`` is traced, before it computes a step (its
chains are registered by then: their states are its arguments), and at the latest at its first block, checkpoint or
end, before the collector writes anything of it.

>>> from jaxstow.io.stopped_runs import StoppedRun
>>> stopped = StoppedRun([0, 1, 2], "samples.h5", "delete samples.h5 to start over")
>>> stopped.refuse_fewer([0, 1])
Traceback (most recent call last):
...
jaxstow.errors.CollectorError: samples.h5 holds the checkpoints of a run of 3 chains (0, 1, 2) that stopped before it finished, and this run continues it with 2 chains (0, 1): chain 2 would be left unfinished. Continue the run with every chain it was started with (3), all at once or one chain per call, or delete samples.h5 to start over; its checkpoints are left as they are
"""

from __future__ import annotations

from collections.abc import Collection

from jaxstow.errors import CollectorError

__all__ = ["StoppedRun", "resumed_before_init"]


class StoppedRun:
    """The chains whose checkpoints a stopped run left at ``where`` (none: no run to continue); ``advice`` says how
    else to start over."""

    def __init__(self, chains: Collection[int] = (), where: str = "", advice: str = "") -> None:
        self.chains = frozenset(chains)
        self.where = where
        self.advice = advice

    def refuse_new(self, chain_id: int) -> None:
        """A :class:`CollectorError` if the run continues this one but registers ``chain_id``, which this one lacks."""
        if self.chains and chain_id not in self.chains:
            raise CollectorError(
                f"{self._held()}, and this run continues it, but registers a chain {chain_id} too, which that run "
                f"did not have. {self._how()}; nothing was written for chain {chain_id}",
                file=self.where,
            )

    def refuse_fewer(self, live: Collection[int]) -> None:
        """A :class:`CollectorError` if the run of the chains ``live`` continues this one without all its chains,
        unless it is a run of one chain (one chain per call: the others wait for the next calls)."""
        missing = sorted(self.chains.difference(live)) if self.chains else []  # none: at no cost, at every block
        if missing and len(live) > 1:  # a run of one chain continues the stopped run one chain per call
            raise CollectorError(
                f"{self._held()}, and this run continues it with {_chains(sorted(live))}: "
                f"{_chains(missing, counted=False)} would be left unfinished. {self._how()}; its checkpoints are left "
                "as they are",
                file=self.where,
            )

    def waiting_after(self, chain_id: int) -> str | None:
        """Why a collector made anew cannot go on past its chain ``chain_id``, which a run finished, to the chains of
        this run that wait (``None`` if none wait)."""
        if not self.chains:
            return None
        return (
            f"{self.where} holds the checkpoints of {_chains(sorted(self.chains), counted=False)}, which wait to be "
            "continued after it: a collector numbers its chains from 0, so only the collector that finished chain "
            f"{chain_id} continues them, with its next init_save (one collector, and its io.save functions, for every "
            "chain's call)"
        )

    def _held(self) -> str:
        return f"{self.where} holds the checkpoints of a run of {_chains(sorted(self.chains))} that stopped before it finished"

    def _how(self) -> str:
        every = f"every chain it was started with ({len(self.chains)})"
        return f"Continue the run with {every}, all at once or one chain per call, or {self.advice}"


def resumed_before_init(where: str) -> CollectorError:
    """The error of ``collector.resume()`` called before ``init_save`` while ``where`` holds a stopped run's
    checkpoints: it would give none, and the caller would start the solver anew where the chains go on."""
    return CollectorError(
        f"{where} holds the checkpoints of a run that stopped before it finished, but collector.resume() was called "
        "before init_save registered its chains, so it has none to give, and the run would go on from the chains' "
        "checkpoints with a solver state started anew: call init_save first, then resume() for each chain's state",
        file=where,
    )


def _chains(ids: list[int], *, counted: bool = True) -> str:
    """``3 chains (0, 1, 2)``, or without ``counted`` ``chains 1, 2`` (``chain 2`` for one)."""
    listed = ", ".join(map(str, ids))
    if not counted:
        return f"chain {listed}" if len(ids) == 1 else f"chains {listed}"
    return f"{len(ids)} chain{'s' if len(ids) != 1 else ''} ({listed})"
