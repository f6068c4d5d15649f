"""The bytes of the peer transport on one TCP connection: how its ends prove themselves, how a message is framed.

On a new connection the receiver sends :data:`CHALLENGE` (the magic and a random nonce); the sender answers with
:data:`HELLO`: its index, the receiver's, a nonce of its own and the HMAC-SHA256 of ``b"hello"`` under the
connection's key (:func:`connection_key`: drawn from the run's secret, both indices and both nonces, so a recorded
answer is worth nothing on another connection); the receiver answers with the HMAC of ``b"welcome"``, proving the
secret back. Then each message is :data:`FRAME` (its number on the connection, its kind, its tag's length and its
payload's length), the tag and the HMAC of those, then the payload and the HMAC of its number and the payload. A
receiver reads at most :data:`HELLO`'s 60 bytes from an unproved connection, and at most :data:`MAX_TAG` bytes of a
message before its header is authenticated.

>>> import secrets
>>> from jaxstow._storage.peer_wire import HELLO, connection_key
>>> HELLO.size, len(connection_key(secrets.token_bytes(32), 0, 1, bytes(16), bytes(16)))
(60, 32)
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import struct
import time
from collections.abc import Iterator
from typing import BinaryIO

from jaxstow._util import jax_compat
from jaxstow.errors import MissingDependencyError

__all__ = [
    "CHALLENGE",
    "FRAME",
    "HELLO",
    "Link",
    "connection_key",
    "host_and_port",
    "listening",
    "read_hello",
    "reachable_host",
]

MAGIC = b"JXP2"
CHALLENGE = struct.Struct("!4s16s")  # magic, the receiver's nonce
HELLO = struct.Struct("!4sII16s32s")  # magic, sender, receiver, the sender's nonce, HMAC
FRAME = struct.Struct("!QBHQ")  # number, kind, tag length, payload length; then the tag and the HMAC of all that
MAC = 32
DATA, ERROR, REQUEST = 0, 1, 2
#: The longest tag, request and error message a receiver reads (once their header is authenticated).
MAX_TAG, MAX_REQUEST, MAX_ERROR = 256, 64 << 10, 4096
CHUNK = 1 << 20
_COORDINATOR = jax_compat.Shim(
    "jax._src.distributed", "global_state.coordinator_address", "to find the address its peers reach it at"
)


class Impostor(EOFError):
    """The process listening at a peer's address does not know the run's secret."""


def connection_key(secret: bytes, sender: int, receiver: int, challenge: bytes, answer: bytes) -> bytes:
    """The key of one connection: drawn from the run's secret, both ends' indices and both nonces."""
    return hmac.digest(secret, b"jaxstow-peers" + struct.pack("!II", sender, receiver) + challenge + answer, "sha256")


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.digest(key, data, "sha256")


def payload_mac(key: bytes, number: int) -> hmac.HMAC:
    """The HMAC of message ``number``'s payload, to be fed the payload."""
    return hmac.new(key, b"P" + struct.pack("!Q", number), "sha256")


class Link:
    """The sending end of a proved connection to one peer: its socket, its key and the next message's number."""

    def __init__(self, connection: socket.socket, key: bytes) -> None:
        self.socket, self.key, self.number = connection, key, 0

    @classmethod
    def prove(cls, address: tuple[str, int], secret: bytes, sender: int, receiver: int, timeout: float) -> Link:
        """Connect to ``address`` and prove this end (process ``sender``); an :class:`Impostor` if the other end
        does not prove itself process ``receiver`` of the run, OSError or EOFError if it drops the connection."""
        connection = socket.create_connection(address, timeout=timeout)
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            magic, challenge = CHALLENGE.unpack(read_exactly(connection, CHALLENGE.size))
            if magic != MAGIC:
                raise Impostor(f"{address} is not a jaxstow peer (it starts with {magic!r})")
            answer = secrets.token_bytes(16)
            key = connection_key(secret, sender, receiver, challenge, answer)
            connection.sendall(HELLO.pack(MAGIC, sender, receiver, answer, _mac(key, b"hello")))
            if not hmac.compare_digest(read_exactly(connection, MAC), _mac(key, b"welcome")):
                raise Impostor(f"{address} did not prove it knows the run's secret: it is not process {receiver}")
        except BaseException:
            shut(connection)
            raise
        return cls(connection, key)

    def alive(self) -> bool:
        """Whether the other end still reads this connection: it never writes to it, so anything to read (its
        end of file, most likely, once it dropped the connection) means it does not."""
        self.socket.settimeout(0)
        try:
            self.socket.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    def send(self, kind: int, tag: bytes, length: int, pieces: Iterator[memoryview], timeout: float) -> None:
        """Send one message of ``length`` bytes (``pieces``), each piece within ``timeout``."""
        self.socket.settimeout(timeout)
        header = FRAME.pack(self.number, kind, len(tag), length) + tag
        self.socket.sendall(header + _mac(self.key, b"H" + header))
        mac = payload_mac(self.key, self.number)
        self.number += 1
        sent = 0
        for piece in pieces:
            mac.update(piece)
            self.socket.sendall(piece)
            sent += piece.nbytes
        if sent != length:
            raise OSError(f"{sent} bytes to send, not the {length} announced (the file changed)")
        self.socket.sendall(mac.digest())


def read_hello(
    connection: socket.socket, secret: bytes, receiver: int, count: int, *, deadline: float | None = None
) -> tuple[int, bytes]:
    """Challenge the process that connected; its index and the connection's key once it proved them, else an
    EOFError (or the OSError of a connection that ended, stalled, or sent its hello too slowly for ``deadline``)."""
    challenge = secrets.token_bytes(16)
    if deadline is not None:
        connection.settimeout(max(deadline - time.monotonic(), 1e-3))
    connection.sendall(CHALLENGE.pack(MAGIC, challenge))
    magic, sender, claimed, answer, proof = HELLO.unpack(read_exactly(connection, HELLO.size, deadline=deadline))
    key = connection_key(secret, sender, claimed, challenge, answer)
    if magic != MAGIC or claimed != receiver or not 0 <= sender < count or sender == receiver:
        raise EOFError(f"not a hello to process {receiver} of {count}")
    if not hmac.compare_digest(proof, _mac(key, b"hello")):
        raise EOFError(f"a hello from 'process {sender}' that does not prove the run's secret")
    return sender, key


def welcome(connection: socket.socket, key: bytes) -> None:
    """Prove the run's secret back to a process that proved it."""
    connection.sendall(_mac(key, b"welcome"))


def read_header(connection: socket.socket, key: bytes, number: int) -> tuple[int, str, int]:
    """The kind, tag and payload length of message ``number``, its header authenticated; else an EOFError."""
    header = read_exactly(connection, FRAME.size)
    found, kind, tag_length, length = FRAME.unpack(header)
    if tag_length > MAX_TAG:
        raise EOFError(f"a message header claiming a tag of {tag_length} bytes")
    header += read_exactly(connection, tag_length)
    if found != number or not hmac.compare_digest(read_exactly(connection, MAC), _mac(key, b"H" + header)):
        raise EOFError("a message header that is not authenticated")
    return kind, header[FRAME.size :].decode(errors="replace"), length


def read_checked(connection: socket.socket, key: bytes, number: int, length: int) -> bytes:
    """A small payload (a request, an error), authenticated."""
    payload = read_exactly(connection, length)
    mac = payload_mac(key, number)
    mac.update(payload)
    if not matches(connection, mac):
        raise EOFError("a message whose payload is not authenticated")
    return payload


def matches(connection: socket.socket, mac: hmac.HMAC) -> bool:
    """Whether the HMAC that follows a payload is ``mac``'s."""
    return hmac.compare_digest(read_exactly(connection, MAC), mac.digest())


def file_pieces(file: BinaryIO, offset: int, length: int) -> Iterator[memoryview]:
    """The ``length`` bytes of ``file`` at ``offset``, in pieces of one buffer (fewer if the file is shorter)."""
    buffer = memoryview(bytearray(min(CHUNK, length)))
    done = 0
    while done < length:
        got = os.preadv(file.fileno(), [buffer[: min(CHUNK, length - done)]], offset + done)
        if not got:
            return
        yield buffer[:got]
        done += got


def listening(host: str, *, backlog: int) -> tuple[socket.socket, str]:
    """A socket listening on ``host`` (an IPv4 or IPv6 address), at a port the system picks, and its address as the
    peers are told it (``[::1]:4321`` for IPv6)."""
    listener = socket.create_server(
        (host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=backlog
    )
    port = listener.getsockname()[1]
    return listener, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_and_port(address: str) -> tuple[str, int]:
    """A peer's address as :func:`listening` gives it, taken apart."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def reachable_host() -> str:
    """The address the others reach this process at: ``JAXSTOW_PEER_HOST``, else the one this host routes to the
    run's coordinator from, else the host name's."""
    if os.environ.get("JAXSTOW_PEER_HOST"):
        return os.environ["JAXSTOW_PEER_HOST"]
    try:
        coordinator = _COORDINATOR.resolve()
    except MissingDependencyError:
        coordinator = None
    if coordinator:
        with contextlib.suppress(OSError):  # the coordinator's family first: an IPv6 run stays on its interface
            for family, _, _, _, address in socket.getaddrinfo(coordinator.rpartition(":")[0].strip("[]"), 9):
                with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as probe:
                    probe.connect(address)
                    return str(probe.getsockname()[0])
    return socket.gethostbyname(socket.gethostname())


def read_exactly(connection: socket.socket, size: int, *, deadline: float | None = None) -> bytes:
    buffer = bytearray(size)
    read_into(connection, memoryview(buffer), deadline=deadline)
    return bytes(buffer)


def read_into(connection: socket.socket, view: memoryview, *, deadline: float | None = None) -> None:
    """Fill ``view`` from ``connection``; by ``deadline`` (``time.monotonic()``), however slowly the bytes come, or a
    ``TimeoutError``."""
    done = 0
    while done < len(view):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{done} of {len(view)} bytes by the deadline")
            connection.settimeout(left)
        got = connection.recv_into(view[done:])
        if not got:
            raise EOFError("closed by the peer" if not done else f"closed after {done} of {len(view)} bytes")
        done += got


def shut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)
    connection.close()


def reason(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
