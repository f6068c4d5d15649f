"""Files another process of the run holds, read by byte ranges as a restore reads them, and the answers to such reads.

A process restoring a step of the local tiers reads the files it holds where they are; a file held elsewhere is a
:class:`PeerFile` whose every read asks the process holding it for exactly the bytes read (over the authenticated
:class:`~jaxstow._storage.peers.PeerTransport`, into the reader's own buffer, the size asked for and no more), so a
restore moves what its devices need, not whole files. :func:`serve_files` answers such requests, for committed
folders only, each file named plainly.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from collections.abc import Callable
from typing import Any, BinaryIO

from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME, StepRecord
from jaxstow._storage.folders import LocalStore
from jaxstow._storage.member_names import is_member_name
from jaxstow._storage.opening import open_source
from jaxstow._storage.peers import PeerTransport
from jaxstow._storage.sources import SourceBase
from jaxstow.checkpoint.tier_holdings import version_of
from jaxstow.errors import CheckpointError, JaxstowError

__all__ = ["PeerFile", "PeerStep", "ask", "serve_files"]

_REQUEST, _REPLY = "read/", "got/"
_SIZE = struct.Struct("!Q")
_numbers = itertools.count()
#: ``locate(owner, step, file, version)``: the path of a file this process holds of the save ``version`` of a step,
#: or a FileNotFoundError.
Locate = Callable[[int, int, str, str], str]


def ask(
    transport: PeerTransport,
    holder: int,
    wanted: dict[str, Any],
    *,
    into: memoryview | None = None,
    sink: BinaryIO | None = None,
    limit: int | None = None,
) -> bytearray | int:
    """Bytes of a file ``holder`` holds (``wanted``: its owner, step, version and file, and the range or ``size``): into
    ``into`` (exactly its size), or at most ``limit`` bytes to ``sink`` or into memory."""
    reply = f"{_REPLY}{next(_numbers)}"
    pending = transport.expect(holder, reply, into=into, sink=sink, limit=limit)
    try:
        transport.request(holder, _REQUEST + reply, json.dumps({**wanted, "reply": reply}).encode())
        return pending.wait()
    finally:
        pending.cancel()


def serve_files(transport: PeerTransport, locate: Locate) -> None:
    """Answer the other processes' reads of the files ``locate`` finds: a size, or the bytes of a range."""

    def answer(source: int, request: bytes) -> None:
        try:
            wanted = json.loads(request)
            reply = wanted["reply"]
        except (ValueError, KeyError, TypeError):
            return  # no tag to answer under: the sender's wait times out
        if not isinstance(reply, str) or not reply.startswith(_REPLY):
            return
        try:
            path = locate(int(wanted["owner"]), int(wanted["step"]), _plain(wanted["file"]), str(wanted["version"]))
            size = os.path.getsize(path)
            if wanted.get("size"):
                transport.send(source, reply, _SIZE.pack(size))
                return
            offset = int(wanted.get("offset", 0))
            length = size - offset if wanted.get("length") is None else int(wanted["length"])
            if offset < 0 or length < 0 or offset + length > size:
                raise CheckpointError(f"{path} has {size} bytes, not {length} at offset {offset}")
            transport.send_file(source, reply, path, offset=offset, length=length)
        except (OSError, ValueError, KeyError, TypeError, JaxstowError) as error:
            transport.send_error(source, reply, f"{type(error).__name__}: {error}")

    transport.serve(_REQUEST, answer)


def _plain(file: Any) -> str:
    if not is_member_name(file):
        raise ValueError(f"{file!r} is not the name of a file in a step's folder")
    return file


class PeerFile(SourceBase):
    """A file that process ``holder`` holds (``owner``'s file of ``step`` as saved by ``version``), read by ranges
    as they are read."""

    def __init__(self, transport: PeerTransport, holder: int, owner: int, step: int, version: str, file: str) -> None:
        self.name = f"{file} of step {step} (process {owner}'s, held by process {holder})"
        self._transport, self._holder = transport, holder
        self._wanted: dict[str, Any] = {"owner": owner, "step": step, "version": version, "file": file}
        size = bytearray(_SIZE.size)
        ask(transport, holder, {**self._wanted, "size": True}, into=memoryview(size))
        self.size = int(_SIZE.unpack(size)[0])

    def read_into(self, offset: int, buffer: memoryview) -> None:
        length = buffer.nbytes
        if offset + length > self.size:
            raise self._truncated(offset, length, max(0, self.size - offset))
        if length:
            ask(self._transport, self._holder, {**self._wanted, "offset": offset, "length": length}, into=buffer)

    def close(self) -> None:
        """Nothing to release: each read is a request of its own."""


class PeerStep(LocalStore):
    """One step of the local tiers as this process reads it: the files it holds where they are (in the local
    directory ``local``, its own, or among the copies it keeps, found by ``locate``), every other one a
    :class:`PeerFile` read from the first process of ``holders[owner]``; ``marker``, the record of ``step`` as saved
    by ``version``."""

    def __init__(
        self,
        transport: PeerTransport,
        local: LocalStore,
        step: int,
        version: str,
        marker: bytes,
        holders: dict[int, list[int]],
        locate: Locate,
    ) -> None:
        super().__init__(local.root, marker=RECORD_NAME)
        self.name = StepNames("%d").name(step)
        self.record = StepRecord.from_json(marker, where=local.url(self.name, RECORD_NAME))
        if version_of(self.record) != version:
            raise CheckpointError(f"step {step} was saved again while it was restored: restore it again")
        self.holders, self._marker, self._transport, self._locate = holders, marker, transport, locate
        self._version = version
        record = self.record
        self._owners = {file: owner for item in record.files for owner, file in enumerate(record.item_files(item))}

    def committed(self) -> list[str]:
        return [self.name]

    def held(self) -> dict[int, str]:
        """The folder this process reads each process's files of the step from, where it holds them itself."""
        me, step = self._transport.index, self.record.step
        return {
            owner: os.path.dirname(self._locate(owner, step, RECORD_NAME, self._version))
            for owner, holding in sorted(self.holders.items())
            if owner == me or me in holding
        }

    def read_marker(self, name: str) -> bytes:
        return self._marker

    def source(self, name: str, file: str, header: str | None = None, *, whole: bool = False) -> Any:
        """``file`` where this process holds it, else read from the process that does."""
        del header, whole
        owner = self._owners.get(file)
        if owner is None:
            raise FileNotFoundError(file)
        if owner == self._transport.index or self._transport.index in self.holders[owner]:
            return open_source(self._locate(owner, self.record.step, file, self._version))
        return PeerFile(self._transport, self.holders[owner][0], owner, self.record.step, self._version, file)
