"""Copies of each process's local files of a step, kept by other processes: sent after each local save, read back by
the processes that lack them (a replaced host), over the authenticated :class:`~jaxstow._storage.peers.PeerTransport`.

Process ``k``'s files of a step are kept by ``replicas`` other processes, those on other slices first, then on other
hosts, then the next ones on the same host (:func:`choose_keepers`); each keeper streams them to
``LOCAL_DIRECTORY/process-{index}/peer-copies/p{k}/{step}/`` and commits them with the step's record; where this
process holds which files is :mod:`jaxstow.checkpoint.tier_holdings`'s. The transport's
secret is made by process 0 and handed out through jax's key-value store, whose keys are deleted once every process
read them. See docs/scaling.md ("Two tiers and peers") and docs/safety.md ("What a run exposes").

>>> from jaxstow.checkpoint.peer_copies import choose_keepers
>>> hosts = ["a", "a", "b", "b"]  # processes 0 and 1 on host a, 2 and 3 on host b
>>> [choose_keepers(k, hosts, replicas=1) for k in range(4)]
[[2], [3], [0], [1]]
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
from collections.abc import Container, Sequence
from typing import Any, BinaryIO, cast

import jax

from jaxstow._coordination import Coordinator
from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME, StepRecord
from jaxstow._storage.failures import storage_failures
from jaxstow._storage.folders import LocalStore
from jaxstow._storage.marker_limit import MAX_MARKER_BYTES
from jaxstow._storage.peer_wire import reachable_host
from jaxstow._storage.peers import PeerTransport, Pending
from jaxstow.checkpoint.copy_check import copy_damage
from jaxstow.checkpoint.peer_reads import PeerStep, ask, serve_files
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.checkpoint.tier_holdings import Holdings, files_of

__all__ = ["PeerCopies", "choose_keepers", "open_transport", "plan_local"]

logger = logging.getLogger("jaxstow.checkpoint.manager")


def open_transport(coordinator: Coordinator) -> PeerTransport:
    """This process's end of a transport between ``coordinator``'s processes: a secret made by process 0 (with
    :mod:`secrets`) and every process's address handed out on the coordinator, whose keys (the secret among them)
    are deleted once every process has read them."""
    with coordinator.conversation("peers") as talk:
        secret = talk.decide("secret", lambda: secrets.token_hex(32), waiting_for="the secret of its peers")
        transport = PeerTransport(
            coordinator.index,
            coordinator.count,
            secret=bytes.fromhex(secret),
            timeout=coordinator.timeout,
            host=reachable_host(),
        )
        try:
            addresses = talk.gather("address", transport.address, waiting_for="its peer address")
        except BaseException:
            transport.close()
            raise
    try:  # every process has read the secret once all reach this barrier: process 0 deletes it as it closes
        with coordinator.conversation("peers-ready") as talk:
            talk.barrier("ready", waiting_for="its peer address")
    except BaseException:
        transport.close()
        raise
    transport.connect(addresses)
    return transport


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


class PeerCopies:
    """This process's part in keeping copies: the processes it sends its files to, those whose files it keeps;
    ``holdings``, where it holds whose files."""

    def __init__(self, coordinator: Coordinator, holdings: Holdings, *, replicas: int) -> None:
        self.coordinator = coordinator
        self.holdings = holdings
        self.local = holdings.local
        self.names = StepNames("%d")
        self.transport = open_transport(coordinator)
        try:
            with coordinator.conversation("hosts") as talk:
                self.hosts = talk.gather("host", host_identity(), waiting_for="its host name")
        except BaseException:
            self.transport.close()
            raise
        me, replicas = coordinator.index, min(replicas, coordinator.count - 1)
        self.keepers = choose_keepers(me, self.hosts, replicas=replicas)
        self.kept = [k for k in coordinator.others if me in choose_keepers(k, self.hosts, replicas=replicas)]
        serve_files(self.transport, holdings.locate)

    def store(self, owner: int) -> LocalStore:
        """The committed copies of ``owner``'s files, one folder per step."""
        return self.holdings.copies(owner)

    def exchange(self, record: StepRecord, *, keep_last: int) -> None:
        """Send this process's files of ``record``'s step to its keepers; receive (streamed to disk, at most the
        free space of the local directory) and commit those it keeps, keeping each owner's newest ``keep_last``."""
        step, me = record.step, self.coordinator.index
        folder = self.names.name(step)
        stagings = []
        try:
            with contextlib.ExitStack() as files:
                expected: list[Pending] = []
                try:
                    for owner in self.kept:  # every receive registered before any byte is sent: none waits on another
                        store = self.store(owner)
                        store.ensure()
                        stagings.append((store, store.stage(folder, replace=folder in store.committed())))
                        room = _free(store.root)
                        for file in files_of(record, owner):
                            _, sink = files.enter_context(stagings[-1][1].open(file))
                            expected.append(self.transport.expect(owner, f"copy/{step}/{file}", limit=room, sink=sink))
                    for keeper in self.keepers:
                        for file in files_of(record, me):
                            self.transport.send_file(keeper, f"copy/{step}/{file}", self.local.path(folder, file))
                    for pending in expected:
                        pending.wait()
                finally:
                    for pending in expected:
                        pending.cancel()
            for _, staging in stagings:
                staging.commit(record.to_json())
        except BaseException:
            for _, staging in stagings:
                staging.abort()
            raise
        for store, _ in stagings:
            for old in self.names.steps(store.committed())[:-keep_last]:
                store.delete(self.names.name(old))

    def gather_step(self, step: int, version: str, plan: dict[str, list[int]]) -> StepFolder | str:
        """The folder to restore ``step`` as saved by ``version`` from, ``plan[owner]`` naming the processes that
        hold each process's files (the owner first where it holds them). Where this process's own tier lacks its files
        (a replaced host), they come back whole from the first process holding an intact copy (this one, where a tier
        left in its local directory holds them), into its local tier, each copy checked before it is committed
        (:func:`~jaxstow.checkpoint.copy_check.copy_damage`); where no copy is intact, the damage of the last one
        tried. Every other file is
        read where this process holds it, else by the byte ranges the restore reads, from the first process holding
        it."""
        me, holdings = self.coordinator.index, self.holdings
        holders = {int(owner): found for owner, found in plan.items()}
        wanted = {"owner": me, "step": step, "version": version, "file": RECORD_NAME}
        marker = self._fetch(holders[me][0], wanted, None, limit=MAX_MARKER_BYTES)
        found = PeerStep(self.transport, self.local, step, version, marker, holders, holdings.locate)
        if not holdings.holds_own(step, version):
            damage = ""
            for holder in holders[me]:
                damage = self._take_own(found, version, holder)
                if not damage:
                    break
            if damage:
                return damage
            holdings.restored(step, version)
        return StepFolder(found, self.names)

    def _take_own(self, found: PeerStep, version: str, holder: int) -> str:
        """Commit into this process's own tier its files of ``found``'s step as ``holder`` holds them, if intact;
        ``""`` if they were, else their damage, where they are (also named in a warning)."""
        me, step, folder = self.coordinator.index, found.record.step, found.name
        self.local.ensure()
        staging = self.local.stage(folder, replace=folder in self.local.committed())
        try:
            for file in files_of(found.record, me):
                with staging.open(file) as (_, sink):
                    wanted = {"owner": me, "step": step, "version": version, "file": file}
                    self._fetch(holder, wanted, sink, limit=_free(self.local.root))
            damage = copy_damage(found, me, lambda file: self.local.path(staging.token, file))
            if damage is None:
                staging.commit(found.read_marker(folder))
                return ""
        except BaseException:
            staging.abort()
            raise
        staging.abort()
        where = (
            f"process {holder}"
            if holder != me
            else os.path.dirname(self.holdings.locate(me, step, RECORD_NAME, version))
        )
        damage = f"{where}: its copy of process {me}'s files of step {step} is damaged: {damage}"
        logger.warning("%s; not restored from", damage)
        return damage

    def _fetch(self, holder: int, wanted: dict[str, Any], sink: BinaryIO | None, *, limit: int) -> bytes:
        """The file ``wanted`` names, from ``holder`` (read here where it is this process): to ``sink``, else
        returned."""
        if holder != self.coordinator.index:
            got = ask(self.transport, holder, wanted, sink=sink, limit=limit)
            return b"" if sink is not None else bytes(cast(bytearray, got))
        path = self.holdings.locate(wanted["owner"], wanted["step"], wanted["file"], wanted["version"])
        with storage_failures(path, doing="read it"), open(path, "rb") as source:
            if sink is None:
                return source.read(limit)
            shutil.copyfileobj(source, sink)
            return b""

    def close(self) -> None:
        self.transport.close()


def plan_local(
    inventories: dict[int, dict[str, list[list[Any]]]], count: int, bound: int | None, skipped: Container[int]
) -> tuple[int, str, dict[str, list[int]]]:
    """The newest step (at most ``bound``, not in ``skipped``: a process holds no intact copy of its files) whose latest save some process holds every process's files of, that
    save's version, and for each owner the processes holding its files (the owner itself first); ``(-1, "", {})``
    if there is none. An earlier save of a step (saved again, with ``force=True`` or after a restart that did not
    restore it) is never restored. ``inventories[process]``: what ``process`` holds,
    :meth:`~jaxstow.checkpoint.tier_holdings.Holdings.inventory`."""
    saves: dict[int, dict[tuple[float, str], dict[str, list[int]]]] = {}
    for process, held in sorted(inventories.items()):
        for owner, entries in held.items():
            for step, version, saved in entries:
                found = saves.setdefault(int(step), {}).setdefault((float(saved), str(version)), {})
                found.setdefault(owner, []).append(process)
    for step in sorted(saves, reverse=True):
        (_, version), found = max(saves[step].items())
        if (bound is None or step <= bound) and step not in skipped and len(found) == count:
            return step, version, {owner: sorted(held, key=lambda k: k != int(owner)) for owner, held in found.items()}
    return -1, "", {}


def _free(root: str) -> int:
    """The bytes free in the file system of ``root``: the most a copy received into it may take."""
    status = os.statvfs(root)
    return status.f_bavail * status.f_frsize
