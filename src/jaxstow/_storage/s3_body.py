"""The body of a GET, read from its socket straight into the caller's buffers, at once or later.

:func:`read_body` reads a whole answer into buffers one after another. :class:`OpenBody` is what is left of an answer
whose first bytes were read: an object opened to be read from its start on asks for a whole first part in one
request, reads its header's bytes, and leaves the rest on the wire; the read that asks for the bytes that follow then
takes them from the socket into its own buffers, with no request of its own and no copy.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

from jaxstow._storage.retrying import BrokenBody

__all__ = ["OpenBody", "let_go", "read_body", "read_start", "views_after", "views_before"]


def _stream(body: Any) -> tuple[Any, Any]:
    """The file of the socket under botocore's body (urllib3's own ``readinto`` reads into a new buffer and copies),
    and urllib3's response, which gives the connection back to its pool (``None`` if the body is something else)."""
    raw = getattr(body, "_raw_stream", None)
    stream = getattr(raw, "_fp", None)
    return (stream, raw) if stream is not None else (body, None)


def views_before(views: Sequence[memoryview], count: int) -> list[memoryview]:
    """The first ``count`` bytes of ``views`` (all of them if they hold fewer)."""
    first = []
    for view in views:
        if count <= 0:
            break
        first.append(view[:count])
        count -= len(first[-1])
    return first


def views_after(views: Sequence[memoryview], count: int) -> list[memoryview]:
    """``views`` without their first ``count`` bytes."""
    rest = []
    for view in views:
        if count >= len(view):
            count -= len(view)
            continue
        rest.append(view[count:])
        count = 0
    return rest


def _drop(body: Any, raw: Any) -> None:
    """Close the connection of a body not read to its end, and give it back to its pool (which connects it again)."""
    body.close()
    if raw is not None:
        raw.release_conn()


def _fill(stream: Any, views: Sequence[memoryview], promised: int) -> int:
    """Read ``stream`` into ``views``, one after another, until they are full or it ends; how many bytes came.

    A stream that breaks off is a :class:`BrokenBody` saying how many bytes came first.
    """
    done = 0
    try:
        for view in views:
            filled = 0
            while filled < len(view):
                count = stream.readinto(view[filled:])
                if not count:
                    return done
                filled += count
                done += count
    except Exception as error:
        raise BrokenBody(done, promised, error) from error
    return done


def read_start(response: dict[str, Any], views: Sequence[memoryview]) -> int:
    """Fill ``views``, one after another, with the first bytes of a GET's body, leaving the rest of it unread; how
    many bytes came (fewer than the views hold when the answer promised fewer: an object's end).

    A body that ends or breaks off before the bytes its answer promised (its ``Content-Length``) is a
    :class:`BrokenBody` saying how many bytes came, its connection dropped.
    """
    body = response["Body"]
    stream, raw = _stream(body)
    total = sum(map(len, views))
    promised = min(int(response.get("ContentLength", total)), total)
    try:
        done = _fill(stream, views, promised)
        if done < promised:
            raise BrokenBody(done, promised)
    except BrokenBody:
        _drop(body, raw)
        raise
    return done


def read_body(response: dict[str, Any], views: Sequence[memoryview]) -> int:
    """Read a GET's body into ``views``, as :func:`read_start` does, and give the connection back to its pool."""
    done = read_start(response, views)
    raw = _stream(response["Body"])[1]
    if raw is not None:
        raw.release_conn()
    return done


def let_go(response: dict[str, Any]) -> None:
    """Drop the connection of an answer whose body is not read to its end."""
    body = response["Body"]
    _drop(body, _stream(body)[1])


def _abandon(body: Any, raw: Any, release: Callable[[], None]) -> None:
    _drop(body, raw)
    release()


class OpenBody:
    """Bytes ``position`` to ``end`` of an object: the rest of an answer's body, not read yet.

    Its connection is given back to the pool once the last byte is read, and dropped if it is closed (or let go)
    before; either way ``release()`` is called then, once.
    """

    def __init__(self, response: dict[str, Any], position: int, end: int, release: Callable[[], None]) -> None:
        self.position = position
        self.end = end
        self._body = response["Body"]
        self._stream, self._raw = _stream(self._body)
        self._release = release
        self._abandon = weakref.finalize(self, _abandon, self._body, self._raw, release)

    def read_into(self, views: Sequence[memoryview]) -> int:
        """Fill ``views`` with the next bytes, as many as there are of them (at most ``end - position``); how many.

        A body that breaks off or ends too soon is closed and raises a :class:`BrokenBody` saying how many bytes came.
        """
        wanted = views_before(views, self.end - self.position)
        count = sum(map(len, wanted))
        try:
            done = _fill(self._stream, wanted, count)
            if done < count:
                raise BrokenBody(done, count)
        except BrokenBody as broken:
            self.position += broken.count
            self.close()
            raise
        self.position += done
        if self.position == self.end and self._abandon.detach() is not None:
            if self._raw is not None:
                self._raw.release_conn()
            self._release()
        return done

    @property
    def ended(self) -> bool:
        """Whether every byte was read, or the body was closed."""
        return not self._abandon.alive

    def close(self) -> None:
        """Drop the connection, with what is left of the body unread (nothing once every byte was read)."""
        self.end = self.position
        self._abandon()
