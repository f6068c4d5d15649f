"""Copies of each process's local files of a step, kept by other processes: sent after each local save, fetched back
by a process that lost its own (a replaced host), over the bounded :class:`~jaxstow._storage.peers.PeerTransport`.

Process ``k``'s files of a step are kept by ``replicas`` other processes, those on other slices first, then on other
hosts, then the next ones on the same host (:func:`choose_keepers`); each keeper stores them under
``LOCAL_DIRECTORY/process-{index}/peer-copies/p{k}/{step}/`` with the step's record, checksummed on arrival. See docs/scaling.md
("Two tiers and peers").

>>> from jaxstow.checkpoint.peer_copies import choose_keepers
>>> hosts = ["a", "a", "b", "b"]  # processes 0 and 1 on host a, 2 and 3 on host b
>>> [choose_keepers(k, hosts, replicas=1) for k in range(4)]
[[2], [3], [0], [1]]
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence

import jax

from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME, StepRecord
from jaxstow._storage.folders import LocalStore
from jaxstow._storage.peers import PeerTransport
from jaxstow.checkpoint.processes import Processes

__all__ = ["COPIES", "PeerCopies", "choose_keepers", "files_of", "plan_local"]

#: The folder of a local directory that holds other processes' files.
COPIES = "peer-copies"


def host_identity() -> str:
    """This process's slice and host: ``JAXSTOW_HOST_NAME`` (for tests) or the host name, after the devices' slice."""
    host = os.environ.get("JAXSTOW_HOST_NAME") or socket.gethostname()
    slice_index = getattr(jax.local_devices()[0], "slice_index", None)
    return f"{slice_index if slice_index is not None else 0}/{host}"


def choose_keepers(owner: int, hosts: Sequence[str], *, replicas: int) -> list[int]:
    """The ``replicas`` processes that keep ``owner``'s files: other slices first, then other hosts, then the same
    host; processes in order of slice, host and index, each group starting one host's worth of processes after
    ``owner`` (the same rank on the next host, so that each process keeps as many copies as it sends)."""
    count = len(hosts)
    order = sorted(range(count), key=lambda k: (hosts[k], k))
    position = {process: index for index, process in enumerate(order)}
    stride = hosts.count(hosts[owner])
    slice_of = [host.partition("/")[0] for host in hosts]

    def rank(other: int) -> tuple[bool, bool, int]:
        distance = (position[other] - position[owner] - stride) % count
        return slice_of[other] == slice_of[owner], hosts[other] == hosts[owner], distance

    return sorted((other for other in range(count) if other != owner), key=rank)[:replicas]


def files_of(record: StepRecord, process: int) -> list[str]:
    """The files ``process`` wrote of the step ``record`` describes."""
    return [record.item_files(item)[process] for item in sorted(record.files)]


class PeerCopies:
    """This process's part in keeping copies: the processes it sends its files to, those whose files it keeps."""

    def __init__(self, processes: Processes, local: LocalStore, *, replicas: int, name: str) -> None:
        self.processes = processes
        self.local = local
        self.names = StepNames("%d")
        self.transport = PeerTransport.start(name, timeout=processes.timeout)
        key = processes.next_exchange("hosts")
        processes.send(f"{key}/{processes.index}", host_identity())
        hosts = processes.gather({k: f"{key}/{k}" for k in range(processes.count)}, what="its host name")
        self.hosts = [hosts[k] for k in range(processes.count)]
        replicas = min(replicas, processes.count - 1)
        self.keepers = choose_keepers(processes.index, self.hosts, replicas=replicas)
        self.kept = [k for k in processes.others if processes.index in choose_keepers(k, self.hosts, replicas=replicas)]

    def store(self, owner: int) -> LocalStore:
        """The committed copies of ``owner``'s files, one folder per step."""
        return LocalStore(os.path.join(self.local.root, COPIES, f"p{owner}"), marker=RECORD_NAME)

    def exchange(self, record: StepRecord, *, keep_last: int) -> None:
        """Send this process's files of ``record``'s step to its keepers; receive and commit those it keeps, keeping
        each owner's newest ``keep_last`` steps."""
        step, me = record.step, self.processes.index
        folder = self.names.name(step)
        for keeper in self.keepers:
            for file in files_of(record, me):
                with open(self.local.path(folder, file), "rb") as source:
                    self.transport.send(keeper, f"copy/{step}/{file}", memoryview(source.read()))
        for owner in self.kept:
            received = {file: self.transport.receive(owner, f"copy/{step}/{file}") for file in files_of(record, owner)}
            store = self.store(owner)
            store.ensure()
            staging = store.stage(folder, replace=folder in store.committed())
            try:
                for file, data in received.items():
                    with staging.open(file) as (_, sink):
                        sink.write(data)
                staging.commit(record.to_json())
            except BaseException:
                staging.abort()
                raise
            for old in self.names.steps(store.committed())[:-keep_last]:
                store.delete(self.names.name(old))

    def inventory(self, own: list[int]) -> dict[str, list[int]]:
        """Whose files of which steps this process holds: its own (``own``, committed locally) and its copies."""
        held = {str(self.processes.index): own}
        for owner in range(self.processes.count):
            if owner != self.processes.index:
                steps = self.names.steps(self.store(owner).committed())
                if steps:
                    held[str(owner)] = steps
        return held

    def gather_step(self, step: int, plan: dict[str, list[int]], *, have: bool) -> None:
        """Bring every process's files of ``step`` into this process's committed local folder of it: from its own
        copies, else from the process the plan names for each owner (``plan[owner]``: the processes holding them).

        ``have`` says whether this process has the step committed locally (its own files and the record)."""
        me, folder = self.processes.index, self.names.name(step)
        record = self._record_source(step, plan, have)
        for owner, holders in sorted(plan.items(), key=lambda item: int(item[0])):
            sender = holders[0]
            if sender == me:  # this process sends owner's files to each process that holds none of them
                source = self.local if int(owner) == me else self.store(int(owner))
                kept = {file: _read(source, folder, file) for file in files_of(self._record(source, step), int(owner))}
                for other in range(self.processes.count):
                    if other not in holders:
                        for file, piece in kept.items():
                            self.transport.send(other, f"fetch/{step}/{file}", piece)
                        if int(owner) == 0 and not self._holds_any(other, plan):
                            self.transport.send(
                                other, f"fetch/{step}/{RECORD_NAME}", _read(source, folder, RECORD_NAME)
                            )
        if record is None:
            marker = bytes(self.transport.receive(plan["0"][0], f"fetch/{step}/{RECORD_NAME}"))
            record = StepRecord.from_json(marker, where=self.local.url(folder, RECORD_NAME))
        self.local.ensure()
        staging = None if have else self.local.stage(folder, replace=False)
        target = self.local.path(folder) if staging is None else None
        try:
            for owner, holders in plan.items():
                if int(owner) == me and have:
                    continue
                for file in files_of(record, int(owner)):
                    path = self.store(int(owner)).path(folder, file)
                    if me in holders and target is not None:  # a copy this process keeps: linked, not copied
                        _link(path, target, file)
                        continue
                    content = (
                        _read_path(path)
                        if me in holders
                        else self.transport.receive(holders[0], f"fetch/{step}/{file}")
                    )
                    _write(staging, target, file, content)
            if staging is not None:
                staging.commit(record.to_json())
        except BaseException:
            if staging is not None:
                staging.abort()
            raise

    def _record_source(self, step: int, plan: dict[str, list[int]], have: bool) -> StepRecord | None:
        me = self.processes.index
        if have:
            return self._record(self.local, step)
        for owner, holders in plan.items():
            if me in holders:
                return self._record(self.store(int(owner)), step)
        return None

    def _holds_any(self, process: int, plan: dict[str, list[int]]) -> bool:
        return any(process in holders for holders in plan.values())

    def _record(self, store: LocalStore, step: int) -> StepRecord:
        return StepRecord.from_json(store.read_marker(self.names.name(step)), where=store.url(str(step), RECORD_NAME))

    def close(self) -> None:
        self.transport.close()


def plan_local(
    inventories: dict[int, dict[str, list[int]]], count: int, bound: int | None
) -> tuple[int, dict[str, list[int]]]:
    """The newest step (at most ``bound``) whose every process's files some process holds, and for each owner the
    processes holding its files (the owner itself first); ``(-1, {})`` if there is none."""
    holders: dict[int, dict[str, list[int]]] = {}
    for process, held in sorted(inventories.items()):
        for owner, steps in held.items():
            for step in steps:
                holders.setdefault(step, {}).setdefault(owner, []).append(process)
    for step in sorted(holders, reverse=True):
        if (bound is None or step <= bound) and len(holders[step]) == count:
            plan = {owner: sorted(found, key=lambda k: k != int(owner)) for owner, found in holders[step].items()}
            return step, plan
    return -1, {}


def _read(store: LocalStore, folder: str, file: str) -> bytes:
    return _read_path(store.path(folder, file))


def _read_path(path: str) -> bytes:
    with open(path, "rb") as source:
        return source.read()


def _link(kept: str, target: str, file: str) -> None:
    """Put the file ``kept`` (durable already) into the committed folder ``target`` as ``file``: a hard link, or a
    copy where the file system has none."""
    partial = os.path.join(target, f".{file}.partial")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(partial)
    try:
        os.link(kept, partial)
    except OSError:
        _write(None, target, file, _read_path(kept))
        return
    os.replace(partial, os.path.join(target, file))


def _write(staging: object, target: str | None, file: str, content: bytes | bytearray) -> None:
    """Write ``file`` into the staging folder, or into the committed folder ``target`` (renamed into place)."""
    if target is None:
        with staging.open(file) as (_, sink):  # type: ignore[attr-defined]
            sink.write(content)
        return
    partial = os.path.join(target, f".{file}.partial")
    with open(partial, "wb") as sink:
        sink.write(content)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(partial, os.path.join(target, file))
