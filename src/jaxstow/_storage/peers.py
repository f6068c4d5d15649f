"""Bytes sent between the processes of a run over TCP: only between them, each wait bounded, each size capped.

Each process listens on the interface that reaches the run's coordinator, never on every interface. A connection counts
once both ends proved they know the run's secret (:mod:`jaxstow._storage.peer_wire`); the sender's index is the one it
proved, never one a message claims. A message's header (its tag and length) is authenticated before anything is
allocated for it, its payload streamed where the receiver wants it (a buffer of the size it asked for, or a file) and
authenticated at its end; a message longer than its receiver accepts is refused unread. At most 16 connections are
proving themselves at once, each on a thread (a new one drops the oldest, and waits for its thread to end), at most 2
per peer once proved. A wait ends once ``timeout`` seconds pass without progress, raising a
:class:`~jaxstow.errors.CheckpointError` naming the peer and the tag. A peer's messages are read in the order sent, each
waiting (at most ``timeout``, then dropped) until its receive is registered: register what you expect
(:meth:`PeerTransport.expect`) before anything makes the peer send it. See docs/safety.md ("What a run exposes").

>>> import secrets
>>> from jaxstow._storage.peers import PeerTransport
>>> key = secrets.token_bytes(32)
>>> one, two = (PeerTransport(index, 2, secret=key, timeout=5, host="127.0.0.1") for index in range(2))
>>> for end in (one, two):
...     end.connect([one.address, two.address])
>>> greeting = two.expect(0, "greeting", limit=100)
>>> one.send(1, "greeting", b"hello")
>>> bytes(greeting.wait()), two.received
(b'hello', 5)
>>> one.close(); two.close()
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, cast

from jaxstow._storage import peer_wire as wire
from jaxstow._storage.peer_wire import CHUNK, DATA, ERROR, MAX_ERROR, MAX_REQUEST, MAX_TAG, REQUEST, Link
from jaxstow._util.signal_free import ThreadPool, start_thread
from jaxstow.errors import ArgumentError, CheckpointError

__all__ = ["Pending", "PeerTransport"]

logger = logging.getLogger("jaxstow.peers")

_HANDSHAKES = 16  # connections proving themselves at once
_PER_PEER = 2  # connections proved, per peer
_SERVERS = 4  # threads answering requests


class Pending:
    """A message this process expects from ``source`` under ``tag``: where its bytes go, how many it accepts."""

    def __init__(
        self,
        transport: PeerTransport,
        source: int,
        tag: str,
        limit: int,
        *,
        exact: bool,
        into: memoryview | None,
        sink: BinaryIO | None,
    ) -> None:
        self.transport, self.source, self.tag, self.limit, self.exact = transport, source, tag, limit, exact
        self.into, self.sink = into, sink
        self.buffer: bytearray | None = None  # the bytes, kept in memory where neither into nor sink is given
        self.count = 0  # bytes received, once done
        self.claimed: socket.socket | None = None  # the connection its bytes come on
        self.done, self.cancelled, self.error = False, False, ""
        self.progress = time.monotonic()
        self.lock = threading.Lock()  # held while bytes go to into or sink, so that none goes once cancelled

    def wait(self) -> bytearray | int:
        """The bytes (a ``bytearray``; the byte count where they went to a buffer or a sink), once authenticated;
        raises once ``timeout`` passes without a byte of it, or if it cannot come."""
        transport = self.transport
        with transport._condition:
            while not self.done:
                problem = self.error or ("was not received: the transport is closed" if transport._closed else "")
                left = self.progress + transport.timeout - time.monotonic()
                if not problem and left <= 0:
                    problem = f"did not arrive within {transport.timeout:g} s (stalled, failed or died)"
                if problem:
                    transport._forget(self)
                    break
                transport._condition.wait(left)
            else:
                return self.buffer if self.buffer is not None else self.count
        with self.lock:  # no byte goes to into or sink from now on
            self.cancelled = True
        raise transport._error(self.source, self.tag, problem)

    def cancel(self) -> None:
        """Accept nothing more for this message (a no-op once it came)."""
        with self.transport._condition:
            self.transport._forget(self)
        with self.lock:
            self.cancelled = True

    def accepts(self, length: int) -> str:
        """Why a message of ``length`` bytes is refused, or ``""``."""
        if length > self.limit or (self.exact and length != self.limit):
            wanted = f"{self.limit}" if self.exact else f"at most {self.limit}"
            return f"was refused: {length} bytes came, {wanted} expected"
        return ""


class PeerTransport:
    """This process's end of the messages between the ``count`` processes of a run that share ``secret``."""

    def __init__(self, index: int, count: int, *, secret: bytes, timeout: float, host: str) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ArgumentError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if len(secret) < 16:
            raise ArgumentError(f"the peers' secret must be at least 16 bytes, not {len(secret)}")
        self.index, self.count, self.timeout = index, count, float(timeout)
        self.received = 0  # payload bytes received, authenticated
        self.refused = 0  # connections that did not prove themselves
        self._secret = secret
        self._addresses: list[tuple[str, int]] = []
        self._pending: dict[tuple[int, str], Pending] = {}
        self._abandoned: set[tuple[int, str]] = set()  # receives given up on: their messages are dropped at once
        self._live: collections.Counter[int] = collections.Counter()
        self._condition = threading.Condition()
        self._outgoing: dict[int, Link] = {}
        self._locks: dict[int, threading.Lock] = collections.defaultdict(threading.Lock)
        self._incoming: set[socket.socket] = set()
        self._handshaking: collections.deque[socket.socket] = collections.deque()
        self._proving = threading.Semaphore(_HANDSHAKES)  # a thread for each connection proving itself
        self._handlers: dict[str, Callable[[int, bytes], None]] = {}
        self._servers: ThreadPoolExecutor | None = None
        self._closed = False
        self._listener, self.address = wire.listening(host, backlog=max(128, 2 * count))  # a burst queues, not retried
        start_thread(threading.Thread(target=self._accept, name="jaxstow-peers", daemon=True))

    def connect(self, addresses: Sequence[str]) -> None:
        """Where every process of the run listens (``host:port``, by index); connections open on first use."""
        self._addresses = [wire.host_and_port(address) for address in addresses]

    def expect(
        self,
        source: int,
        tag: str,
        *,
        limit: int | None = None,
        into: memoryview | None = None,
        sink: BinaryIO | None = None,
    ) -> Pending:
        """Accept one message from ``source`` under ``tag``: exactly ``len(into)`` bytes written into ``into``, or
        at most ``limit`` bytes written to ``sink`` (or kept in memory, allocated once authenticated)."""
        if (into is None) == (limit is None):
            raise ArgumentError("expect() takes a limit (bytes at most) or a buffer to fill (into=), one of them")
        if into is not None and (into.format != "B" or into.ndim != 1):
            into = into.cast("B")
        size = len(into) if into is not None else int(limit or 0)
        pending = Pending(self, source, tag, size, exact=into is not None, into=into, sink=sink)
        with self._condition:
            if (source, tag) in self._pending:
                raise ArgumentError(f"a message {tag!r} from process {source} is expected already")
            self._pending[(source, tag)] = pending
            self._abandoned.discard((source, tag))
            self._condition.notify_all()
        return pending

    def receive(self, source: int, tag: str, *, limit: int) -> bytearray:
        """The message ``source`` sent under ``tag``, at most ``limit`` bytes."""
        return cast(bytearray, self.expect(source, tag, limit=limit).wait())

    def send(self, to: int, tag: str, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` to process ``to`` under ``tag``; returns once it is handed to the network, each wait
        (connecting included) at most ``timeout`` seconds."""
        view = memoryview(data).cast("B")
        self._send(to, tag, DATA, view.nbytes, (view[start : start + CHUNK] for start in range(0, len(view), CHUNK)))

    def send_file(self, to: int, tag: str, path: str, *, offset: int = 0, length: int | None = None) -> None:
        """Send the ``length`` bytes of the file ``path`` at ``offset`` (the rest of it by default), read as sent."""
        with open(path, "rb") as file:
            total = os.fstat(file.fileno()).st_size - offset if length is None else length
            self._send(to, tag, DATA, total, wire.file_pieces(file, offset, total))

    def send_error(self, to: int, tag: str, problem: str) -> None:
        """Tell ``to`` that the message it expects under ``tag`` will not come, and why."""
        message = problem.encode()[:MAX_ERROR]
        self._send(to, tag, ERROR, len(message), iter([memoryview(message)]))

    def request(self, to: int, tag: str, payload: bytes) -> None:
        """Send ``to`` a request (at most ``MAX_REQUEST`` bytes) for the handler it serves ``tag``'s prefix with."""
        if len(payload) > MAX_REQUEST:
            raise ArgumentError(f"a request is at most {MAX_REQUEST} bytes, not {len(payload)}")
        self._send(to, tag, REQUEST, len(payload), iter([memoryview(payload)]))

    def serve(self, prefix: str, handler: Callable[[int, bytes], None]) -> None:
        """Answer requests whose tag starts with ``prefix``: ``handler(source, request)``, on a thread of a few."""
        self._handlers[prefix] = handler

    def close(self) -> None:
        """Stop listening and close every connection; messages not received are dropped."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        for connection in [self._listener, *[link.socket for link in self._outgoing.values()]]:
            wire.shut(connection)
        for connection in list(self._incoming) + list(self._handshaking):
            wire.shut(connection)
        self._outgoing.clear()
        if self._servers is not None:
            self._servers.shutdown(wait=False)

    # -- sending ----------------------------------------------------------------------------------------------------

    def _send(self, to: int, tag: str, kind: int, length: int, pieces: Iterator[memoryview]) -> None:
        encoded = tag.encode()
        if not 0 <= to < self.count or to == self.index:
            raise ArgumentError(f"process {self.index} sends to another of the {self.count} processes, not {to}")
        if len(encoded) > MAX_TAG:
            raise ArgumentError(f"a tag is at most {MAX_TAG} bytes, not {len(encoded)} ({tag[:40]!r}...)")
        with self._locks[to]:
            try:
                link = self._outgoing.get(to)
                if link is None or not link.alive():
                    self._drop(to)
                    link = self._connect(to)
                link.send(kind, encoded, length, pieces, self.timeout)
            except (OSError, EOFError) as error:
                self._drop(to)
                raise self._error(to, tag, f"could not be sent: {wire.reason(error)}") from None

    def _connect(self, to: int) -> Link:
        """A proved connection to ``to``; tried again until ``timeout`` while ``to`` drops it unproved (too many
        connections at once)."""
        if not self._addresses:
            raise CheckpointError(f"process {self.index} has no addresses of its peers: call connect() first")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                left = max(1e-3, deadline - time.monotonic())
                link = self._outgoing[to] = Link.prove(self._addresses[to], self._secret, self.index, to, left)
                return link
            except wire.Impostor:
                raise
            except (OSError, EOFError) as error:
                if time.monotonic() + 0.1 > deadline:
                    where = "{}:{}".format(*self._addresses[to])
                    raise EOFError(
                        f"{where} did not take a proved connection within {self.timeout:g} s (stalled, failed or "
                        f"died, or not a process of this run; the last try: {wire.reason(error)})"
                    ) from None
                time.sleep(0.1)

    def _drop(self, to: int) -> None:
        link = self._outgoing.pop(to, None)
        if link is not None:
            wire.shut(link.socket)

    # -- receiving --------------------------------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._condition:
                self._handshaking.append(connection)
                oldest = self._handshaking.popleft() if len(self._handshaking) > _HANDSHAKES else None
            if oldest is not None:
                wire.shut(oldest)  # its thread ends: strangers cannot hold every slot
            self._proving.acquire()  # a flood of connections never runs more than _HANDSHAKES threads at once
            start_thread(threading.Thread(target=self._serve_connection, args=(connection,), daemon=True))

    def _serve_connection(self, connection: socket.socket) -> None:
        source, why, refused = -1, "", None
        try:
            source, key = self._handshake(connection)
            if source >= 0:
                self._read_frames(connection, source, key)
        except _Refused as error:
            why, refused = str(error), error.pending
        except (OSError, EOFError) as error:
            why = wire.reason(error)
        finally:
            wire.shut(connection)
            with self._condition:  # one step: a receive registered after this is not failed by this connection
                if connection in self._handshaking:
                    self._handshaking.remove(connection)
                if connection in self._incoming:
                    self._incoming.discard(connection)
                    self._live[source] -= 1
                    if refused is not None:
                        refused.error = why
                    for (sender, _), pending in list(self._pending.items()):
                        if sender == source and (pending.claimed is connection or not self._live[source]):
                            pending.error = pending.error or f"never came: the connection ended ({why})"
                            self._forget(pending)
                self._condition.notify_all()

    def _handshake(self, connection: socket.socket) -> tuple[int, bytes]:
        """The process at the other end and the connection's key, or ``(-1, b"")`` for a stranger (dropped)."""
        try:
            deadline = time.monotonic() + min(self.timeout, 10.0)  # for the whole hello, however slowly it comes
            sender, key = wire.read_hello(connection, self._secret, self.index, self.count, deadline=deadline)
            with self._condition:
                if self._closed or self._live[sender] >= _PER_PEER or connection not in self._handshaking:
                    raise EOFError(f"process {sender} has {_PER_PEER} connections open already")
                self._handshaking.remove(connection)
                self._incoming.add(connection)
                self._live[sender] += 1
            wire.welcome(connection, key)
            connection.settimeout(None)
            return sender, key
        except (OSError, EOFError, ValueError) as error:  # ValueError: a hello cut short or malformed
            with self._condition:
                self.refused += 1
            logger.debug("process %d refused a connection: %s", self.index, wire.reason(error))
            return -1, b""
        finally:
            self._proving.release()

    def _read_frames(self, connection: socket.socket, source: int, key: bytes) -> None:
        """Read ``source``'s messages until its connection ends."""
        scratch = memoryview(bytearray(CHUNK))
        for number in itertools.count():
            kind, tag, length = wire.read_header(connection, key, number)
            if kind == REQUEST:
                if length > MAX_REQUEST:
                    raise EOFError(f"a request of {length} bytes")
                self._answer(source, tag, wire.read_checked(connection, key, number, length))
                continue
            pending = self._claim(connection, source, tag)
            refusal = f"was refused: an error message of {length} bytes" if kind == ERROR and length > MAX_ERROR else ""
            refusal = refusal or (pending.accepts(length) if pending is not None and kind == DATA else "")
            if refusal:
                raise _Refused(pending, refusal)
            if kind == ERROR:
                problem = wire.read_checked(connection, key, number, length).decode(errors="replace")
                if pending is not None:
                    self._fail(pending, f"could not be sent: {problem}")
            elif not self._stream(connection, pending, length, wire.payload_mac(key, number), scratch):
                raise _Refused(pending, "came damaged: its authentication code does not match")

    def _claim(self, connection: socket.socket, source: int, tag: str) -> Pending | None:
        """The receive registered for ``(source, tag)``, waited for at most ``timeout``; ``None``: its bytes are
        read and dropped."""
        deadline = time.monotonic() + self.timeout

        def unclaimed() -> Pending | None:
            pending = self._pending.get((source, tag))
            return pending if pending is not None and pending.claimed is None else None

        with self._condition:
            while unclaimed() is None and (source, tag) not in self._abandoned and time.monotonic() < deadline:
                if self._closed:
                    break
                self._condition.wait(deadline - time.monotonic())
            self._abandoned.discard((source, tag))
            pending = unclaimed()
            if pending is None:
                logger.warning("process %d dropped %r from process %d: nothing expected it", self.index, tag, source)
                return None
            pending.claimed = connection  # another connection of the same process cannot write into it
            return pending

    def _stream(
        self, connection: socket.socket, pending: Pending | None, length: int, mac: hmac.HMAC, scratch: memoryview
    ) -> bool:
        """Read a payload of ``length`` bytes into ``pending``'s buffer or sink (or nowhere), authenticating it."""
        if pending is not None and pending.into is None and pending.sink is None:
            pending.buffer = bytearray(length)  # authenticated, and within what the receiver accepts
            pending.into = memoryview(pending.buffer)
        done = 0
        while done < length:
            piece = scratch[: min(CHUNK, length - done)]
            wire.read_into(connection, piece)
            mac.update(piece)
            if pending is not None:
                self._put(pending, done, piece)
            done += piece.nbytes
        good = wire.matches(connection, mac)
        if pending is not None and good:
            with self._condition:
                if not pending.error:
                    pending.count, pending.done = length, True
                    self.received += length
                self._forget(pending)
                self._condition.notify_all()
        return good

    def _put(self, pending: Pending, offset: int, piece: memoryview) -> None:
        """Hand ``piece`` (at ``offset`` of its message) to its receiver, unless it gave up waiting."""
        failure = ""
        with pending.lock:
            if pending.cancelled or pending.error:
                return
            try:
                if pending.sink is not None:
                    pending.sink.write(piece)
                else:
                    pending.into[offset : offset + piece.nbytes] = piece  # type: ignore[index]
            except (OSError, ValueError) as error:  # ValueError: a sink closed meanwhile
                failure = f"could not be written: {wire.reason(error)}"
            pending.progress = time.monotonic()
        if failure:
            self._fail(pending, failure)

    def _fail(self, pending: Pending, problem: str) -> None:
        with self._condition:
            pending.error = problem
            self._forget(pending)
            self._condition.notify_all()

    def _forget(self, pending: Pending) -> None:
        """Drop ``pending`` from the receives registered (not another one registered under its name since)."""
        if self._pending.get((pending.source, pending.tag)) is pending:
            del self._pending[(pending.source, pending.tag)]
            if not pending.done:
                self._abandoned.add((pending.source, pending.tag))

    def _answer(self, source: int, tag: str, request: bytes) -> None:
        handler = next((self._handlers[prefix] for prefix in self._handlers if tag.startswith(prefix)), None)
        if handler is None:
            logger.warning("process %d dropped request %r of process %d: it serves none", self.index, tag, source)
            return
        if self._servers is None:
            self._servers = ThreadPool(_SERVERS, thread_name_prefix="jaxstow-peers-serve")
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            self._servers.submit(_logged, handler, source, request)

    def _error(self, peer: int, tag: str, problem: str) -> CheckpointError:
        return CheckpointError(f"message {tag!r} between process {self.index} and process {peer} {problem}")


class _Refused(EOFError):
    """A message refused (too long, damaged): its connection ends, failing ``pending`` (if any) with the reason."""

    def __init__(self, pending: Pending | None, problem: str) -> None:
        super().__init__(problem)
        self.pending = pending


def _logged(handler: Callable[[int, bytes], None], source: int, request: bytes) -> None:
    try:
        handler(source, request)
    except Exception:  # a request that could not be answered: its sender's wait says so
        logger.exception("a request of process %d failed", source)
