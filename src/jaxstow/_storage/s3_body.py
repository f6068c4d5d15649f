"""The body of a GET, read from its socket straight into the caller's buffers, at once or later.

:func:`read_body` reads a whole answer into buffers one after another. :class:`OpenBody` is what is left of an answer
whose first bytes were read: an object opened to be read from its start on asks for a whole first part in one
request, reads its header's bytes, and leaves the rest on the wire; the read that asks for the bytes that follow then
takes them from the socket into its own buffers, with no request of its own and no copy. :func:`read_range` reads
the answer to a ranged GET only once it is the bytes asked for: a server or proxy that ignores ``Range`` (a ``200``
with the whole object) has the bytes before the offset skipped, and an answer that starts elsewhere, or stops short of
the bytes asked for where the object does not end, is a :class:`WrongAnswer`, a fault of the storage to try again,
never bytes taken for others or for the object's end. An answer from another object than the one opened (another
ETag than the first answer's, a server or cache that ignores ``If-Match``) is :class:`Replaced`, never read.

>>> import io
>>> answer = {"Body": io.BytesIO(b"0123456789"), "ContentLength": 10, "ResponseMetadata": {"HTTPStatusCode": 200}}
>>> into = bytearray(3)
>>> read_range(answer, 4, [memoryview(into)]), bytes(into)  # the whole object, for bytes 4-6: the first 4 skipped
(3, b'456')
>>> short = {"Body": io.BytesIO(b"45"), "ContentLength": 2, "ContentRange": "bytes 4-6/10"}
>>> read_range(short, 4, [memoryview(into)])
Traceback (most recent call last):
...
jaxstow._storage.s3_body.WrongAnswer: asked for bytes 4-6, the server sent 2 of them (Content-Range bytes 4-6/10, Content-Length 2), and the object does not end there
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from jaxstow._storage.retrying import BrokenBody

__all__ = [
    "OpenBody",
    "Replaced",
    "WrongAnswer",
    "first_size",
    "let_go",
    "read_body",
    "read_range",
    "read_start",
    "views_after",
    "views_before",
]

_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_SKIP = 1 << 20


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


class WrongAnswer(BrokenBody):
    """An answer to a ranged GET that is not the bytes asked for (``count`` of them, those that came first, are)."""

    def __init__(self, count: int, problem: str) -> None:
        super().__init__(count, count)
        self.args = (problem,)


class Replaced(Exception):
    """An answer from another object than the one opened: its ETag is not the first answer's, or, where an ETag does
    not tell, its size. Not a fault that passes: the object now in the store is another."""


def _content_range(response: dict[str, Any], offset: int, asked: str) -> tuple[int, int | None]:
    """The last byte and the object's size (``None``: not told) that an answer's ``Content-Range`` names; one that
    does not start at ``offset`` or contradicts itself (a last byte at or past the size) is a :class:`WrongAnswer`."""
    answered = response.get("ContentRange")
    found = _RANGE.fullmatch(str(answered).strip())
    total = int(found[3]) if found is not None and found[3] != "*" else None
    if found is None or int(found[1]) != offset or (total is not None and int(found[2]) >= total):
        let_go(response)
        raise WrongAnswer(0, f"asked for {asked}, the server answered with {answered!r}")
    return int(found[2]), total


def _same_object(response: dict[str, Any], etag: str | None, size: int | None, total: int | None) -> None:
    """Raise unless an answer is from the object whose first answer had ``etag`` and ``size``: :class:`Replaced` if
    its ETag is another, or its size where no ETag tells; a :class:`WrongAnswer` if the same ETag comes with another
    size (answers that contradict each other). Its connection is dropped then."""
    now = response.get("ETag")
    problem: Exception | None = None
    if etag is not None and now is not None and now != etag:
        problem = Replaced(f"its ETag is now {now}, where it was {etag} when it was opened")
    elif size is not None and total is not None and total != size:
        if etag is not None and now == etag:
            problem = WrongAnswer(0, f"the server says the object has {total} bytes, and said {size} for its ETag")
        else:
            problem = Replaced(f"it now has {total} bytes, where it had {size} when it was opened")
    if problem is not None:
        let_go(response)
        raise problem


def first_size(response: dict[str, Any], length: int) -> int | None:
    """The object's size, as the answer to a GET of its first ``length`` bytes tells it in its ``Content-Range``
    (``None``: it has none, the whole object, or a size not told).

    One that contradicts itself (a last byte at or past the object's size, more bytes than it names) is a
    :class:`WrongAnswer`, its connection dropped: never a size taken for the object's.
    """
    asked = f"bytes 0-{length - 1}"
    if response.get("ContentRange") is None:
        return None
    end, total = _content_range(response, 0, asked)
    if int(response.get("ContentLength", end + 1)) > end + 1:
        let_go(response)
        raise WrongAnswer(
            0, f"asked for {asked}, the server sent Content-Length {response['ContentLength']} for {end + 1} bytes"
        )
    return total


def read_range(
    response: dict[str, Any],
    offset: int,
    views: Sequence[memoryview],
    *,
    size: int | None = None,
    etag: str | None = None,
) -> int:
    """Read the answer to a GET of the bytes at ``offset`` into ``views``, one after another, and give its connection
    back (or drop it, if bytes are left unread); how many bytes there were (fewer only where the object ends).

    A ``206`` must start at ``offset`` and hold every byte asked for, up to the object's end; a ``200`` (a server that
    ignores ``Range``) is the whole object, whose first ``offset`` bytes are skipped. Any other answer is a
    :class:`WrongAnswer`, its connection dropped; a body that breaks off a :class:`BrokenBody`. ``size`` and ``etag``:
    the object's, as its first answer told them; an answer with another ETag, or another size and no ETag to tell, is
    :class:`Replaced` (none of its bytes read), and one that ends before ``size`` is wrong too.

    >>> import io
    >>> other = {"Body": io.BytesIO(b"456"), "ContentLength": 3, "ContentRange": "bytes 4-6/10", "ETag": '"b"'}
    >>> read_range(other, 4, [memoryview(bytearray(3))], size=10, etag='"a"')
    Traceback (most recent call last):
    ...
    jaxstow._storage.s3_body.Replaced: its ETag is now "b", where it was "a" when it was opened
    """
    length = sum(map(len, views))
    asked = f"bytes {offset}-{offset + length - 1}"
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    answered = response.get("ContentRange")
    sent = int(response["ContentLength"]) if "ContentLength" in response else None
    skip, total = 0, None
    if answered is not None:
        end, total = _content_range(response, offset, asked)
        covered = end + 1 - offset
        sent = covered if sent is None else min(sent, covered)
    elif status == 206:
        let_go(response)
        raise WrongAnswer(0, f"asked for {asked}, the server answered 206 with no Content-Range")
    else:  # the whole object: a server or proxy that ignores Range
        skip, total = offset, sent
        sent = None if sent is None else max(0, sent - offset)
    _same_object(response, etag, size, total)
    if size is not None:
        total = size
    expected = length if total is None else max(0, min(length, total - offset))
    wanted = views_before(views, expected if sent is None else min(expected, sent))
    try:
        _skip(response, skip)
        done = read_start(response, wanted)
    except BrokenBody:
        raise
    except BaseException:
        let_go(response)
        raise
    if done < expected:
        let_go(response)
        raise WrongAnswer(
            done,
            f"asked for {asked}, the server sent {done} of them (Content-Range {answered}, Content-Length "
            f"{response.get('ContentLength')}), and the object does not end there",
        )
    if sent is not None and done == sent:
        raw = _stream(response["Body"])[1]
        if raw is not None:
            raw.release_conn()
    else:
        let_go(response)
    return done


def _skip(response: dict[str, Any], count: int) -> None:
    """Read and drop the first ``count`` bytes of a GET's body."""
    if not count:
        return
    scratch = memoryview(bytearray(min(count, _SKIP)))
    body = response["Body"]
    stream, raw = _stream(body)
    try:
        while count:
            done = _fill(stream, [scratch[: min(count, len(scratch))]], count)
            if not done:
                raise BrokenBody(0, count)
            count -= done
    except BrokenBody as broken:  # none of the bytes asked for came
        _drop(body, raw)
        raise BrokenBody(0, count, broken) from broken


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
