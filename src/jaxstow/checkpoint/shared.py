"""One step committed by the processes of a run together; one process is the case N=1 of the same code.

Every process writes its own files and says what it wrote, on one
:class:`~jaxstow._coordination.Conversation`; process 0 checks that every process saved the same step of the same
tree, makes the record and decides the outcome, which every process hears: an error anywhere, or a process that
never reports, leaves no committed step and reaches every process, each wait bounded by the run's
``process_timeout``. A ``shared`` folder (the persistent ``directory``) is one folder that process 0 stages and
commits; otherwise (the local tier) each process commits its own folder with the record process 0 made. See
docs/scaling.md ("The commit protocol").

>>> import tempfile, numpy as np
>>> from jaxstow._coordination import Coordinator
>>> from jaxstow._steps.record import RECORD_NAME
>>> from jaxstow._storage.store import open_store
>>> from jaxstow._write.held import hold
>>> from jaxstow.checkpoint.writing import StepContent, write_items
>>> store = open_store(tempfile.mkdtemp(), marker=RECORD_NAME)
>>> content = StepContent(7, {"params": hold({"w": np.ones(2)})}, False, metrics=None, metadata=None)
>>> talk = Coordinator(store.location, timeout=60).conversation("save")
>>> committed = commit_content(talk, store, "7", content, "step 7", False, shared=True)
>>> committed.record.files, store.committed()
({'params': 'params.safetensors'}, ['7'])
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from jaxstow._coordination import Conversation
from jaxstow._steps.record import StepRecord
from jaxstow._storage.store import Staging, Store
from jaxstow._write.encoded import differing_layout, differing_leaves
from jaxstow._write.replica_sets import differing_replicas
from jaxstow.checkpoint.writing import StepContent, write_items
from jaxstow.errors import CheckpointError

__all__ = ["Committed", "abandon", "commit_content", "commit_step", "record_of"]


@dataclass(frozen=True)
class Committed:
    """A committed step's record, and the steps process 0 deleted after committing it (by the keep policy)."""

    record: StepRecord
    deleted: list[int] = field(default_factory=list)


def commit_step(
    talk: Conversation,
    store: Store,
    folder: str,
    step: int,
    write: Callable[[Staging], Any],
    make_record: Callable[[list[Any]], StepRecord],
    *,
    shared: bool,
    replace: bool,
    decided: Callable[[StepRecord], None] | None = None,
    after: Callable[[StepRecord], Iterator[int]] | None = None,
) -> Committed:
    """Commit ``step`` as ``folder`` of ``store`` in every process of ``talk`` (closed once done); the same outcome
    everywhere.

    Args:
        write: Writes this process's files into the staging folder; returns its summary (JSON).
        make_record: In process 0, the record from every process's summary, in process order; it raises where they
            do not agree.
        shared: One folder for every process, committed by process 0; else a folder per process, each committed
            by its own process with process 0's record.
        replace: Whether a committed folder of that name may be replaced; else it is a :class:`CheckpointError`.
        decided: Called in every process once process 0 decided that the step is committed (its record), and,
            where each process commits a folder of its own, once this process committed its own.
        after: In process 0, once the shared folder is committed: the steps it then deletes, one by one, told to
            every process with the outcome (an error of its own is raised in process 0 only).
    """
    with talk:
        coordinator = talk.coordinator
        where = store.url(folder)
        made: list[Staging] = []  # process 0's shared staging folder, made as it decides
        try:
            token = _staging_token(talk, store, folder, step, made, shared=shared, replace=replace)
        except CheckpointError as error:
            if coordinator.index != 0:  # process 0 failed or never answered: it decides no outcome to wait for
                talk.fail("done", error)
            raise
        try:
            staging = made[0] if made else _stage(store, folder, step, replace=replace, token=token)
        except CheckpointError as error:
            if coordinator.index == 0:
                raise
            # Process 0's folder is gone: it failed and removed it (its outcome says why), or this process does not
            # see process 0's storage (process 0 says so, from this process's report).
            talk.fail("done", error)
            talk.decide("outcome", dict, waiting_for=f"the commit of step {step} ({where})")
            raise
        try:
            summary = write(staging)
            staging.complete()
        except BaseException as error:
            staging.abort()
            talk.fail("done", error)
            if coordinator.index == 0:
                talk.fail("outcome", error)
            elif shared and isinstance(error, Exception):  # process 0's failure, removing the folder, may be the cause
                talk.decide("outcome", dict, waiting_for=f"the commit of step {step} ({where})")
            raise
        talk.tell("done", summary)
        record: StepRecord | None = None
        pruning: list[BaseException] = []  # process 0: what ``after`` raised, raised once the outcome is told

        def decide() -> dict[str, Any]:
            nonlocal record
            try:  # a process that never reports leaves no staging folder behind either
                heard = talk.collect("done", waiting_for=f"its files of step {step} ({where})")
                failed = [
                    f"process {message.sender} failed: {message.error}" for message in heard.values() if message.error
                ]
                if failed:
                    raise CheckpointError(f"step {step} is not committed: {'; '.join(failed)}", file=where)
                record = make_record([heard[index].payload for index in range(coordinator.count)])
                if shared:
                    staging.commit(record.to_json())
            except BaseException:
                if shared:
                    staging.abort()
                raise
            deleted: list[int] = []
            if shared and after is not None:
                try:  # the step is committed: what fails now is process 0's own, told to no one
                    deleted.extend(after(record))
                except Exception as error:
                    pruning.append(error)
            return {"record": record.to_json().decode(), "deleted": deleted}

        try:
            outcome = talk.decide("outcome", decide, waiting_for=f"the commit of step {step} ({where})")
        except BaseException:
            # Its own folder; not its files in process 0's, which process 0 may commit still, having heard them
            # (the wait ran out here), and removes whole where it fails.
            if not shared:
                staging.abort()
            raise
        marker = str(outcome["record"]).encode()
        if record is None:
            record = StepRecord.from_json(marker, where=where)
        if not shared:
            try:
                staging.commit(marker)
            except BaseException:  # a record that cannot be written (a full disk): the step is not held here
                staging.abort()
                raise
        if decided is not None:
            decided(record)
        if pruning:
            raise pruning[0]
        return Committed(record, [int(old) for old in outcome["deleted"]])


def abandon(talk: Conversation, error: BaseException) -> None:
    """Fail the step of ``talk`` (closed here) in every process, from one process that met ``error`` before writing
    anything: process 0 fails the staging folder and the outcome, which every process waits for; another process
    fails its files, which process 0 waits for. The processes' next conversations then pair up again."""
    with talk:
        if talk.coordinator.index == 0:
            talk.fail("staging", error)
            talk.fail("outcome", error)
        else:
            talk.fail("done", error)


def commit_content(
    talk: Conversation,
    store: Store,
    folder: str,
    content: StepContent,
    what: str,
    bar: bool,
    *,
    shared: bool,
    replace: bool = False,
    decided: Callable[[StepRecord], None] | None = None,
    after: Callable[[StepRecord], Iterator[int]] | None = None,
    held: Callable[[], None] | None = None,
) -> Committed:
    """Commit the step of ``content`` as ``folder`` of ``store`` (:func:`commit_step`): each process writes its file
    of every item, reported as ``what`` (a progress bar if ``bar``); process 0 makes the record and keeps steps by
    policy (``after``), each once ``held()`` (raising where the writer's lock was lost) returned."""
    me = talk.coordinator.index
    many = talk.coordinator.many

    def write(staging: Staging) -> dict[str, Any]:
        summary = write_items(staging, me, content, what=what, bar=bar)
        if many:  # process 0's metrics and metadata are recorded: every process must have saved the same
            summary["annotations"] = _annotations(content)
        return summary

    def record(summaries: list[dict[str, Any]]) -> StepRecord:
        if held is not None:
            held()
        return record_of(summaries, content, where=store.url(folder))

    def keep(record: StepRecord) -> Iterator[int]:
        """``after(record)``, ``held()`` asked before each step it deletes: a writer held up past its lease (another
        host took the lock over meanwhile) deletes none of that writer's steps."""
        deleting = iter(()) if after is None else after(record)
        while True:
            if held is not None:
                held()
            deleted = next(deleting, None)
            if deleted is None:
                return
            yield deleted

    return commit_step(
        talk,
        store,
        folder,
        content.step,
        write,
        record,
        shared=shared,
        replace=replace,
        decided=decided,
        after=keep,
    )


def _staging_token(
    talk: Conversation, store: Store, folder: str, step: int, made: list[Staging], *, shared: bool, replace: bool
) -> str | None:
    """The token of the staging folder process 0 made for every process (into ``made`` in process 0), or ``None``
    where each process stages a folder of its own."""
    if not shared:
        return None

    def make() -> str:
        made.append(_stage(store, folder, step, replace=replace))
        return made[0].token

    return str(talk.decide("staging", make, waiting_for=f"the folder of step {step} ({store.url(folder)})"))


def _stage(store: Store, folder: str, step: int, *, replace: bool, token: str | None = None) -> Staging:
    """A staging folder of ``folder``: this process's own, or process 0's of that ``token``."""
    if token is not None:
        return store.stage(folder, replace=False, token=token)
    exists = folder in store.committed()
    if exists and not replace:
        raise CheckpointError(
            f"step {step} already exists in {store.location}; pass force=True to replace it", file=store.url(folder)
        )
    return store.stage(folder, replace=exists)


def record_of(summaries: list[dict[str, Any]], content: StepContent, *, where: str) -> StepRecord:
    """The record of the step of ``content`` that every process saved, from their ``summaries`` (in process order),
    checked to agree: a :class:`CheckpointError` names every process that saved another step, another tree, other
    values than process 0 where each process saves them once for all (small unsharded leaves, see
    :func:`~jaxstow._write.encoded.encode_tree`), other copies of a shard than another process holding it (see
    :mod:`~jaxstow._write.replica_sets`), or other metrics or metadata (process 0's are recorded)."""
    step = content.step
    _check_agreement(summaries, content, where=where)
    files = summaries[0]["files"]
    parts = {name: [other["files"][name] for other in summaries[1:]] for name in files} if summaries[1:] else {}
    headers = {file: header for summary in summaries for file, header in summary["headers"].items()}
    return StepRecord(
        step,
        files,
        content.single,
        content.metrics,
        content.metadata,
        keep_policy=content.keep_policy,
        parts=parts,
        headers=headers,
    )


_PER_PROCESS_ADVICE = (
    "every process must save the same value there (process 0's is the one saved): wrap state that is each "
    "process's own in jaxstow.per_process(...)"
)


_REPLICAS_ADVICE = (
    "a global array whose replicas differ between processes, which would be saved as a mix of their copies: give "
    "every process the same values (the same seed, or process 0's sent to all with "
    "jax.experimental.multihost_utils.broadcast_one_to_all)"
)


def _check_agreement(summaries: list[dict[str, Any]], content: StepContent, *, where: str) -> None:
    """Raise naming every process that saved another step, another tree, other values, other metrics or metadata, or
    with another keep policy than process 0, and every two processes holding other copies of a shard."""
    step = content.step
    problems = []
    values = False  # whether values, metrics or metadata differ (rather than the step or the tree)
    policies = False  # whether keep policies differ
    first = summaries[0]
    digests = first["digests"]
    for index, summary in enumerate(summaries):
        if summary.get("step") != step:
            problems.append(f"process {index} saved step {summary.get('step')}, process 0 step {step}")
            continue
        theirs = summary.get("digests", {})
        differing = sorted(name for name in {*digests, *theirs} if digests.get(name) != theirs.get(name))
        layouts = [name for name in differing if _layout(digests.get(name)) != _layout(theirs.get(name))]
        if layouts:
            problems.append(
                f"process {index} saved other trees than process 0 for the items {layouts}"
                f"{_differing_layout(content, layouts[0], digests.get(layouts[0]), theirs.get(layouts[0]))}: "
                "another structure, or "
                "a leaf of another dtype, shape or layout (every process builds a global array on the same mesh, "
                "in the same device order, with the same partition spec; a library that orders leaves by Python's "
                "hash, as FlareJax does, needs the same PYTHONHASHSEED in every process)"
            )
        elif differing:
            where_found = _differing_leaves(content, differing[0], digests[differing[0]], theirs[differing[0]])
            values = True  # process 0's value would be saved
            problems.append(
                f"process {index} saved other values than process 0 for the items {differing} ({where_found})"
            )
        ours, others = first.get("annotations", {}), summary.get("annotations", {})
        what = [kind for kind in ("metrics", "metadata") if others.get(kind) != ours.get(kind)]
        if what:
            values = True
            problems.append(f"process {index} saved other {' and '.join(what)} than process 0")
        if others.get("keep policy") != ours.get("keep policy"):
            policies = True
            problems.append(f"process {index} keeps other steps than process 0 (its CheckpointManager's keep=)")
    problems.extend(_replica_problems(summaries, content))
    if problems:
        advice = f"; {_PER_PROCESS_ADVICE}" if values else ""
        if policies:
            advice += "; make the CheckpointManager with the same keep=KeepPolicy(...) in every process"
        raise CheckpointError(f"step {step} is not committed: " + "; ".join(problems) + advice, file=where)


def _layout(digest: str | None) -> str | None:
    return None if digest is None else digest.partition(":")[0]


def _differing_layout(content: StepContent, name: str, ours: str | None, theirs: str | None) -> str:
    """Where in item ``name`` the trees first differ, as `` (first at the leaf ...)``, if it can be told."""
    if name not in content.held or ours is None or theirs is None:
        return ""
    paths = [entry["path"] for entry in content.held[name].encode().manifest["leaves"]]
    found = differing_layout(ours, theirs, len(paths))
    if found is None:
        return ""
    if found == len(paths):
        return f" (its tree has more leaves, after process 0's last, {name}/{paths[-1]})" if paths else ""
    return f" (from process 0's leaf {name}/{paths[found]} on)"


def _differing_leaves(content: StepContent, name: str, ours: str, theirs: str) -> str:
    """Where in item ``name`` the values first differ: a leaf's path, or the paths of a group of leaves."""
    if name not in content.held:
        return f"item {name!r}"
    entries = content.held[name].encode().manifest["leaves"]
    paths = [entry["path"] for entry in entries]
    found = differing_leaves(ours, theirs, len(paths))
    if found is None:
        return f"item {name!r}"
    start, stop = found
    return _leaves_named(name, paths, start, stop - 1)


def _leaves_named(name: str, paths: list[str], first: int, last: int) -> str:
    """The leaves of item ``name`` from its ``first`` to its ``last`` (one leaf where they are the same)."""
    named = [f"{name}/{paths[k]}" if paths[k] else name for k in (first, last)]
    return f"first at the leaf {named[0]}" if first == last else f"first among the leaves {named[0]} to {named[1]}"


def _replica_problems(summaries: list[dict[str, Any]], content: StepContent) -> list[str]:
    """Each two processes that hold other copies of a shard of an item, where every process saved the step and that
    item's tree as process 0 did (the same layout: the same processes hold each shard)."""
    problems = []
    for name, item in content.held.items():
        layout = _layout(summaries[0]["digests"].get(name))
        if any(s.get("step") != content.step or _layout(s.get("digests", {}).get(name)) != layout for s in summaries):
            continue
        tree = item.encode()
        paths = [entry["path"] for entry in tree.manifest["leaves"]]
        for found in differing_replicas(
            [summary.get("replicas", {}).get(name, {}) for summary in summaries], tree.leaves
        ):
            located = "" if found.leaves is None else f"{_leaves_named(name, paths, *found.leaves)}, "
            problems.append(
                f"processes {found.first} and {found.other} hold other copies of the shards they share of the items "
                f"{[name]} ({located}{_REPLICAS_ADVICE})"
            )
    return problems


def _annotations(content: StepContent) -> dict[str, str]:
    """Hashes of the metrics, metadata and keep policy of ``content``, to compare with other processes' (process 0's
    are recorded, and its policy deletes the steps)."""
    kinds = (("metrics", content.metrics), ("metadata", content.metadata), ("keep policy", content.keep_policy))
    return {
        kind: hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:16]
        for kind, value in kinds
    }
