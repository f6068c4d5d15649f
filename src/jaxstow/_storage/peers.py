"""Bytes sent between the processes of a ``jax.distributed`` run over TCP, every wait bounded by a deadline.

jax's collectives cannot time out, so a stalled or dead process would hang the others in them. Here each process
listens on a socket of its own, publishes its ``host:port`` in the run's key-value store, and every wait (the address,
the connection, a send, a receive) ends within ``timeout`` seconds or raises a
:class:`~jaxstow.errors.CheckpointError` naming the peer and the message's tag. Each message carries the xxh3-64 of
its bytes, checked on arrival. Messages are kept by ``(source, tag)``, so that their order does not matter.

>>> from jaxstow._storage.peers import PeerTransport
>>> peers = PeerTransport.start("doctest", timeout=5)
>>> peers.send(0, "greeting", b"hello")
>>> bytes(peers.receive(0, "greeting")), peers.process_count
(b'hello', 1)
>>> peers.close()
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import socket
import struct
import threading
import time
from typing import Any

import jax
import numpy as np

from jaxstow._format.checksum import as_bytes, checksum_bytes
from jaxstow._util import jax_compat
from jaxstow.errors import ArgumentError, CheckpointError, MissingDependencyError

__all__ = ["PeerTransport", "frame_header"]

_HEADER = struct.Struct("!4sIIQ16s")  # magic, source, tag length, payload length, checksum (16 hex digits)
_MAGIC = b"JXP1"
#: Transports started so far under each name by this process: every process starts the same ones in the same order.
_starts: dict[str, itertools.count[int]] = {}
_COORDINATOR = jax_compat.Shim(
    "jax._src.distributed", "global_state.coordinator_address", "to find the address its peers reach it at"
)


def frame_header(source: int, tag: str, payload: bytes | memoryview, checksum: str | None = None) -> bytes:
    """The bytes that precede ``payload`` on the wire: the header and the tag (``checksum`` replaces the payload's)."""
    encoded = tag.encode()
    digest = (checksum or checksum_bytes(payload)).encode()
    return _HEADER.pack(_MAGIC, source, len(encoded), memoryview(payload).nbytes, digest) + encoded


class PeerTransport:
    """This process's end of the run's point-to-point messages, under one name."""

    process_index: int
    process_count: int

    def __init__(self, key: str, *, timeout: float, client: Any) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ArgumentError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.process_index = int(jax.process_index())
        self.process_count = int(jax.process_count())
        self.timeout = float(timeout)
        self._key = key
        self._client = client
        self._arrived: dict[tuple[int, str], collections.deque[bytearray | str]] = collections.defaultdict(
            collections.deque
        )
        self._ended: dict[int, str] = {}  # source -> why its connection ended
        self._condition = threading.Condition()
        self._outgoing: dict[int, socket.socket] = {}
        self._locks: dict[int, threading.Lock] = collections.defaultdict(threading.Lock)
        self._incoming: list[socket.socket] = []
        self._closed = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("0.0.0.0", 0))
        self._listener.listen(max(16, self.process_count))
        threading.Thread(target=self._accept, name=f"jaxstow-peers-{key}", daemon=True).start()

    @classmethod
    def start(cls, name: str, *, timeout: float) -> PeerTransport:
        """This process's transport named ``name``, its address published for the others (the same ``name`` and
        ``timeout`` in every process, started in the same order)."""
        count = next(_starts.setdefault(name, itertools.count(1)))
        client = jax_compat.distributed_client() if jax.process_count() > 1 else None
        if jax.process_count() > 1 and client is None:
            raise CheckpointError("jax sees several processes but no jax.distributed client: call initialize()")
        transport = cls(f"jaxstow/peers/{name}/{count}", timeout=timeout, client=client)
        if client is not None:
            port = transport._listener.getsockname()[1]
            client.key_value_set(f"{transport._key}/{transport.process_index}", f"{_own_host()}:{port}")
        return transport

    def send(self, to: int, tag: str, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Send ``data`` to process ``to`` under ``tag``; returns once the bytes are handed to the network (at most
        ``timeout`` seconds, connecting included)."""
        payload = as_bytes(np.ascontiguousarray(data)) if isinstance(data, np.ndarray) else memoryview(data).cast("B")
        if to == self.process_index:
            self._deliver(to, tag, bytearray(payload))
            return
        deadline = time.monotonic() + self.timeout
        with self._locks[to]:
            try:
                connection = self._outgoing.get(to) or self._connect(to, tag, deadline)
                connection.settimeout(max(1e-3, deadline - time.monotonic()))
                connection.sendall(frame_header(self.process_index, tag, payload))
                connection.sendall(payload)
            except (OSError, TimeoutError) as error:
                self._drop(to)
                raise self._error(to, tag, f"could not be sent: {_reason(error)}") from None

    def receive(self, source: int, tag: str) -> bytearray:
        """The bytes process ``source`` sent under ``tag``, their checksum verified; waits at most ``timeout``."""
        deadline = time.monotonic() + self.timeout
        key = (source, tag)
        with self._condition:
            while not self._arrived.get(key):
                if self._closed:
                    raise self._error(source, tag, "was not received: the transport is closed")
                if source in self._ended:
                    raise self._error(source, tag, f"never came: the connection ended ({self._ended[source]})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._error(
                        source, tag, f"did not arrive within {self.timeout:g} s (stalled, failed or died)"
                    )
                self._condition.wait(left)
            got = self._arrived[key].popleft()
        if isinstance(got, str):
            raise self._error(source, tag, got)
        return got

    def close(self) -> None:
        """Stop listening and close every connection; messages not received are dropped."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        for connection in [self._listener, *self._outgoing.values(), *self._incoming]:
            _shut(connection)
        self._outgoing.clear()

    def __enter__(self) -> PeerTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self, to: int, tag: str, deadline: float) -> socket.socket:
        if not 0 <= to < self.process_count:
            raise ArgumentError(f"no process {to} among {self.process_count}")
        try:
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            address = str(self._client.blocking_key_value_get(f"{self._key}/{to}", left_ms))
        except Exception as error:  # jax raises its runtime's own error types here
            raise self._error(to, tag, f"could not be sent: no address published ({_reason(error)})") from None
        host, _, port = address.rpartition(":")
        connection = socket.create_connection((host, int(port)), timeout=max(1e-3, deadline - time.monotonic()))
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._outgoing[to] = connection
        return connection

    def _drop(self, to: int) -> None:
        connection = self._outgoing.pop(to, None)
        if connection is not None:
            _shut(connection)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._incoming.append(connection)
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        """Read frames from one peer's connection until it ends."""
        source = -1
        try:
            while True:
                header = _read_exactly(connection, _HEADER.size)
                if header is None:
                    raise EOFError("closed by the peer")
                magic, source, tag_length, length, digest = _HEADER.unpack(header)
                if magic != _MAGIC:
                    raise EOFError(f"not a jaxstow peer message (starts with {magic!r})")
                tag = (_read_exactly(connection, tag_length) or b"").decode(errors="replace")
                payload = bytearray(length)
                if length and _read_into(connection, memoryview(payload)) < length:
                    raise EOFError(f"closed after {tag!r} began")
                found = checksum_bytes(memoryview(payload))
                if found != digest.decode(errors="replace"):
                    self._deliver(
                        source, tag, f"is damaged: checksum {found}, expected {digest.decode(errors='replace')}"
                    )
                else:
                    self._deliver(source, tag, payload)
        except (OSError, EOFError, UnicodeDecodeError) as error:
            if source >= 0:
                with self._condition:
                    self._ended[source] = _reason(error)
                    self._condition.notify_all()
        finally:
            _shut(connection)

    def _deliver(self, source: int, tag: str, got: bytearray | str) -> None:
        with self._condition:
            self._arrived[(source, tag)].append(got)
            self._condition.notify_all()

    def _error(self, peer: int, tag: str, problem: str) -> CheckpointError:
        return CheckpointError(f"message {tag!r} between process {self.process_index} and process {peer} {problem}")


def _own_host() -> str:
    """The address the others reach this process at: ``JAXSTOW_PEER_HOST``, else the one this host routes to the
    run's coordinator from, else the host name's."""
    if os.environ.get("JAXSTOW_PEER_HOST"):
        return os.environ["JAXSTOW_PEER_HOST"]
    try:
        coordinator = _COORDINATOR.resolve()
    except MissingDependencyError:
        coordinator = None
    if coordinator:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((coordinator.rpartition(":")[0], 9))
                return str(probe.getsockname()[0])
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


def _read_exactly(connection: socket.socket, size: int) -> bytes | None:
    buffer = bytearray(size)
    return bytes(buffer) if _read_into(connection, memoryview(buffer)) == size else None


def _read_into(connection: socket.socket, view: memoryview) -> int:
    done = 0
    while done < len(view):
        got = connection.recv_into(view[done:])
        if not got:
            break
        done += got
    return done


def _shut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)
    connection.close()


def _reason(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
