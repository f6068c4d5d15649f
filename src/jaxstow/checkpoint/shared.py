"""One step saved by every process of a ``jax.distributed`` run: each writes its own files, process 0 commits.

It all runs in each process's background save. Process ``k`` writes ``item.pk.safetensors`` with its own shards
(its share of each replicated one) and per-process values, and sends one summary; process 0 checks that every process saved the same step of the same tree,
writes ``checkpoint.json`` and commits, and sends the outcome, so an error anywhere, or a process that never reports,
leaves no committed step and reaches every process. The protocol, its O(processes) messages and its bounded waits:
see docs/scaling.md ("The commit protocol", "Waits, timeouts and failures").
"""

from __future__ import annotations

import json
from typing import Any

from jaxstow._steps.record import Metrics, StepRecord
from jaxstow._storage.store import Staging, Store
from jaxstow._write.held import HeldTree
from jaxstow._write.save_report import SaveReport
from jaxstow.checkpoint.processes import Processes
from jaxstow.errors import CheckpointError

__all__ = ["record_of", "save_shared"]

_COMMITTED = "committed"


def save_shared(
    processes: Processes,
    store: Store,
    *,
    key: str,
    step: int,
    folder: str,
    items: dict[str, HeldTree],
    extension: str,
    single: bool,
    metrics: Metrics | None,
    metadata: dict[str, Any] | None,
    replace: bool,
    progress: SaveReport,
    keep_policy: dict[str, Any] | None = None,
) -> StepRecord | None:
    """Write this process's files of ``step`` and take part in its commit; process 0 returns the committed record.

    ``key`` names this save in the messages, the same in every process.
    """
    me = processes.index
    where = store.url(folder)
    if me == 0:
        staging = store.stage(folder, replace=replace)
        processes.send(f"{key}/staging", staging.token)
    else:
        token = processes.receive(f"{key}/staging", sender=0, what=f"the folder of step {step} ({where})")
        staging = store.stage(folder, replace=replace, token=token)
    try:
        summary = _write_files(staging, me, step, items, extension, progress)
        staging.complete()
    except BaseException as error:
        processes.send(f"{key}/done/{me}", json.dumps({"error": f"{type(error).__name__}: {error}"}))
        if me == 0:
            _give_up(processes, key, staging, f"process 0 failed: {error}")
        else:
            staging.abort()
        raise
    processes.send(f"{key}/done/{me}", json.dumps(summary))
    if me != 0:
        outcome = processes.receive(
            f"{key}/outcome",
            sender=0,
            what=f"the commit of step {step} ({where})",
            timeout=processes.timeout + processes.grace,
        )
        if outcome != _COMMITTED:
            raise CheckpointError(f"step {step} was not committed: {outcome}", file=where)
        return None
    try:
        reports = processes.gather(
            {k: f"{key}/done/{k}" for k in processes.others}, what=f"its files of step {step} ({where})"
        )
        record = record_of(processes, summary, reports, step, single, metrics, metadata, keep_policy, where=where)
        staging.commit(record.to_json())
    except BaseException as error:
        _give_up(processes, key, staging, str(error))
        raise
    processes.send(f"{key}/outcome", _COMMITTED)
    return record


def _write_files(
    staging: Staging, me: int, step: int, items: dict[str, HeldTree], extension: str, progress: SaveReport
) -> dict[str, Any]:
    files, digests, headers = {}, {}, {}
    for name, item in items.items():
        encoded = item.encode()
        with staging.open(f"{name}{f'.p{me}' if me else ''}{extension}") as (stored, sink):
            header = encoded.write(progress.sink(sink))
        files[name], digests[name] = stored, encoded.digest
        if header is not None:
            headers[stored] = header
    return {"step": step, "files": files, "digests": digests, "headers": headers}


def record_of(
    processes: Processes,
    summary: dict[str, Any],
    reports: dict[int, str],
    step: int,
    single: bool,
    metrics: Metrics | None,
    metadata: dict[str, Any] | None,
    keep_policy: dict[str, Any] | None,
    *,
    where: str,
) -> StepRecord:
    """The record of a step that every process saved: process 0's ``summary`` and the others' ``reports`` (their
    summaries as JSON), checked to agree."""
    summaries = [summary] + [json.loads(reports[k]) for k in processes.others]
    _check_agreement(summaries, step=step, where=where)
    files = summary["files"]
    parts = {name: [other["files"][name] for other in summaries[1:]] for name in files}
    headers = {file: header for other in summaries for file, header in other["headers"].items()}
    return StepRecord(step, files, single, metrics, metadata, keep_policy=keep_policy, parts=parts, headers=headers)


def _check_agreement(summaries: list[dict[str, Any]], *, step: int, where: str) -> None:
    """Raise naming every process that failed or saved another step or another tree than process 0."""
    problems = []
    first = summaries[0]
    for index, summary in enumerate(summaries):
        if "error" in summary:
            problems.append(f"process {index} failed: {summary['error']}")
        elif summary.get("step") != step:
            problems.append(f"process {index} saved step {summary.get('step')}, process 0 step {step}")
        elif summary.get("digests") != first["digests"]:
            differing = sorted(
                name
                for name in {*first["digests"], *summary.get("digests", {})}
                if first["digests"].get(name) != summary.get("digests", {}).get(name)
            )
            problems.append(f"process {index} saved other trees than process 0 for the items {differing}")
    if problems:
        raise CheckpointError(f"step {step} is not committed: " + "; ".join(problems), file=where)


def _give_up(processes: Processes, key: str, staging: Staging, reason: str) -> None:
    staging.abort()
    processes.send(f"{key}/outcome", reason)
