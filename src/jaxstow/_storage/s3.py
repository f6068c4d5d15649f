"""``s3://`` objects read and written with botocore, many requests at once, straight into the caller's buffers.

fsspec's s3fs resolves the storage options (keys, endpoint, profile, fsspec's ``FSSPEC_S3*`` variables, AWS's own);
this module builds a botocore client with the same settings and moves the bytes itself: each ranged GET is read from
the socket into its place in the final buffer (no copy in Python), ``requests`` of them in flight, paced under a
bandwidth cap when there is one. Chosen by measurement against obstore and s3fs (``bench/bench_object_store.py``):
the least client CPU per byte read of the three, and the only one of them that lands bytes in a given buffer.

Payloads are not signed (``UNSIGNED-PAYLOAD``, as botocore over https): each part carries its CRC32, which the server
checks, and every leaf its xxh3. ``config_kwargs={"s3": {"payload_signing_enabled": True}}`` signs them again.

Every request goes through one :class:`~jaxstow._storage.retrying.Retries` policy, reads and writes alike: botocore's
own retries are turned off in this client, and the attempts its ``retries`` config (or ``AWS_MAX_ATTEMPTS``) gives
are this policy's, unless the :class:`Transfer` names its own. A ranged GET whose body breaks off is taken up again
where it broke; one answered with other bytes than those asked for, or fewer where the object does not end (a server
or proxy that ignores or cuts ``Range``), is tried again too (:func:`~jaxstow._storage.s3_body.read_range`), and
never taken for the object's bytes or its end. One answered from another object than the first answer's (another
ETag: replaced, and ``If-Match`` ignored) is a :class:`~jaxstow.errors.StorageError` that says so, never its bytes.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from jaxstow._storage import s3_body
from jaxstow._storage.buckets import nothing_at
from jaxstow._storage.retrying import BrokenBody, Retries, configured_attempts, error_code
from jaxstow._storage.s3_body import OpenBody, let_go, read_body, read_range, read_start, views_after, views_before
from jaxstow._storage.sources import SourceBase
from jaxstow._storage.transfer import Lanes, Transfer, lanes
from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError, PathNotFoundError, StorageError

__all__ = ["HEAD_BYTES", "Head", "S3Bucket", "S3Object", "is_s3", "s3_errors"]

#: Bytes read when an object is opened: its size comes with them, and a jaxstow header of up to this size too.
HEAD_BYTES = 64 << 10
_MISSING = frozenset({"NoSuchKey", "404", "NoSuchBucket", "NotFound"})
_DELETED = (
    "was deleted after it was opened (a step's file: by the keep policy of the run saving there, or by delete()): "
    "nothing of it was used; open the newest file, or have the run keep more steps"
)
_REPLACED = "the object was replaced while it was read ({}): nothing of it was used; open it and read it again"

T = TypeVar("T")


class Head(NamedTuple):
    """What an object's first GET told: its first bytes, its size, the rest of the answer left unread, its ETag."""

    data: bytes
    size: int
    body: OpenBody | None
    etag: str | None


class _Client(NamedTuple):
    """A botocore client, the attempts its retry settings give, and how many answers it may leave half read."""

    client: Any
    attempts: int | None
    open_bodies: threading.BoundedSemaphore


_clients: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], _Client]] = weakref.WeakKeyDictionary()
_clients_lock = threading.Lock()


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is an s3fs file system, whose objects this module moves."""
    return type(fs).__name__ == "S3FileSystem" and hasattr(fs, "split_path")


def _client(fs: Any, requests: int) -> _Client:
    """A botocore client with the settings of the s3fs file system ``fs``, as s3fs makes its own, and the attempts
    its retry settings give (``None``: they name none).

    It pools enough connections for ``requests`` reads, as many uploads, as many answers left half read
    (:class:`OpenBody`, at most ``requests``) and as many objects being opened; one per file system and size, made
    once per process. Its own retries are off: :class:`S3Bucket` retries every request with the one policy.
    """
    with _clients_lock:
        made = _clients.setdefault(fs, {})
        key = (os.getpid(), requests)
        if key not in made:
            made[key] = _new_client(fs, requests)
        return made[key]


def _new_client(fs: Any, requests: int) -> _Client:
    config_module = require("botocore.config", extra="s3", purpose="reading and writing s3:// objects")
    session_module = require("botocore.session", extra="s3", purpose="reading and writing s3:// objects")

    client_kwargs = dict(fs.client_kwargs)
    init = {
        "aws_access_key_id": fs.key,
        "aws_secret_access_key": fs.secret,
        "aws_session_token": fs.token,
        "endpoint_url": fs.endpoint_url,
    }
    init = {name: value for name, value in init.items() if value is not None and value != client_kwargs.get(name)}
    if "use_ssl" not in client_kwargs:
        init["use_ssl"] = fs.use_ssl
    config = dict(fs.config_kwargs)
    config.setdefault("connect_timeout", fs.connect_timeout)
    config.setdefault("read_timeout", fs.read_timeout)
    config["max_pool_connections"] = max(int(config.get("max_pool_connections", 0)), 4 * requests + 4)
    config["s3"] = {"payload_signing_enabled": False, **config.get("s3", {})}
    try:  # s3fs passes the options it does not know on to botocore's session
        session = session_module.Session(**fs.kwargs)
    except TypeError as error:
        unknown = f"storage_options {sorted(fs.kwargs)} hold an option s3fs does not know ({error})"
        raise ArgumentError(f"{unknown}; a client's option goes in client_kwargs") from None
    retries = dict(config.get("retries") or {})
    attempts = configured_attempts(retries, session.get_config_variable("max_attempts"))
    config["retries"] = {**{name: value for name, value in retries.items() if name == "mode"}, "total_max_attempts": 1}
    if fs.anon:
        secret = {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
        init = {name: value for name, value in init.items() if name not in secret}
        client_kwargs = {name: value for name, value in client_kwargs.items() if name not in secret}
        config["signature_version"] = require("botocore", extra="s3", purpose="anonymous s3:// access").UNSIGNED
    client = session.create_client("s3", config=config_module.Config(**config), **init, **client_kwargs)
    return _Client(client, attempts, threading.BoundedSemaphore(requests))


@contextlib.contextmanager
def s3_errors(url: str) -> Iterator[None]:
    """A failed request as a jaxstow error naming ``url``.

    A missing object or bucket is a :class:`PathNotFoundError`, any other failure a :class:`StorageError`: one that
    says so for an object replaced while it was read (``If-Match`` refused, or :class:`~.s3_body.Replaced`).
    """
    botocore = require("botocore.exceptions", extra="s3", purpose="reading and writing s3:// objects")

    try:
        yield
    except s3_body.Replaced as replaced:
        raise StorageError(_REPLACED.format(replaced), file=url) from None
    except botocore.ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in _MISSING:
            raise nothing_at(url, bucket_missing=code == "NoSuchBucket") from None
        if code == "PreconditionFailed":
            raise StorageError(_REPLACED.format("its ETag is not the one it had when opened"), file=url) from None
        raise StorageError(f"the storage failed: {error}", file=url) from error
    except botocore.BotoCoreError as error:
        raise StorageError(f"the storage failed: {type(error).__name__}: {error}", file=url) from error


class S3Bucket:
    """One bucket of an s3fs file system, as botocore moves its objects for one :class:`Transfer`."""

    def __init__(self, fs: Any, bucket: str, transfer: Transfer) -> None:
        self.fs = fs
        self.bucket = bucket
        self.lanes: Lanes = lanes(transfer)
        self.client, configured, self.open_bodies = _client(fs, transfer.requests)
        self.retries: Retries = transfer.retries(configured)
        self._extra = dict(fs.s3_additional_kwargs)
        self._extra.update(fs.req_kw)

    def extra(self, operation: str) -> dict[str, Any]:
        """The file system's additional arguments (encryption, requester pays, ...) that ``operation`` takes."""
        if not self._extra:
            return {}
        members = self.client.meta.service_model.operation_model(operation).input_shape.members
        return {name: value for name, value in self._extra.items() if name in members}

    def request(self, send: Callable[[], T], *, url: str, doing: str) -> T:
        """``send()``, one request or a few, under the retry policy; what fails as a jaxstow error naming ``url``."""
        with s3_errors(url):
            return self.retries.call(send, url=url, doing=doing)

    def get_into(
        self,
        key: str,
        offset: int,
        views: Sequence[memoryview],
        *,
        url: str,
        version: str | None = None,
        etag: str | None = None,
        size: int | None = None,
    ) -> int:
        """Read the bytes at ``offset`` into ``views``, one after another, with one ranged GET.

        Taken up again where a broken connection cut it. Returns how many bytes there were (fewer at the end of the
        object). ``etag`` and ``size``: the object's, as its first answer told them. The GET asks for the object only
        if it still has that ETag (``If-Match``), and an answer with another ETag (a server that ignores ``If-Match``),
        or another size and no ETag, is a :class:`StorageError` saying it was replaced, never its bytes; one that ends
        before ``size`` is a fault of the storage, tried again.
        """
        wanted = sum(len(view) for view in views)
        done = 0

        def rest() -> int:
            nonlocal done
            try:
                done += self._get(key, offset + done, views_after(views, done), version=version, etag=etag, size=size)
            except BrokenBody as broken:
                done += broken.count
                raise
            return done

        with self.lanes.reading:
            if self.lanes.read_pace is not None:
                self.lanes.read_pace.wait(wanted)
            return self.request(rest, url=url, doing=f"reading bytes {offset}-{offset + wanted - 1} (GetObject)")

    def _get(
        self, key: str, offset: int, views: list[memoryview], *, version: str | None, etag: str | None, size: int | None
    ) -> int:
        length = sum(len(view) for view in views)
        arguments = self._arguments(key, version, Range=f"bytes={offset}-{offset + length - 1}")
        if etag is not None and not version:
            arguments["IfMatch"] = etag
        try:
            response = self.client.get_object(**arguments, **self.extra("GetObject"))
        except Exception as error:
            if error_code(error) != "InvalidRange":
                raise
            if size is not None:  # the range starts at or past the end, and the object went on past it
                raise s3_body.Replaced(f"it now ends before byte {offset}, and had {size} bytes") from None
            return 0
        return read_range(response, offset, views, size=size, etag=etag)

    def _arguments(self, key: str, version: str | None, **more: str) -> dict[str, Any]:
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Key": key, **more}
        if version:
            arguments["VersionId"] = version
        return arguments

    def size(self, key: str, *, url: str, version: str | None = None) -> int:
        """The object's size, from a HEAD request."""
        arguments = {**self._arguments(key, version), **self.extra("HeadObject")}
        return self.request(
            lambda: int(self.client.head_object(**arguments)["ContentLength"]), url=url, doing="reading its size"
        )

    def head(self, key: str, length: int, *, url: str, version: str | None, keep: int | None = None) -> Head:
        """The first ``length`` bytes of the object (fewer if it is shorter), its size and ETag, from one GET.

        With ``keep``, only the first ``keep`` of those bytes are read, and the rest of the answer is left unread, an
        :class:`OpenBody` (``None`` when nothing is left) that holds one of :attr:`open_bodies` until it ends; when
        none is free, only the first ``keep`` bytes are asked for.
        """
        held = keep is not None and self.open_bodies.acquire(blocking=False)
        if keep is not None and not held:
            length, keep = keep, None
        arguments = {**self._arguments(key, version, Range=f"bytes=0-{length - 1}"), **self.extra("GetObject")}
        if self.lanes.read_pace is not None:  # the rest of a body left open is paced as it is read
            self.lanes.read_pace.wait(length if keep is None else keep)

        def first() -> Head:
            try:
                response = self.client.get_object(**arguments)
            except Exception as error:
                if error_code(error) == "InvalidRange":
                    return Head(b"", -1, None, None)  # an empty object
                raise
            etag = response.get("ETag")
            total = s3_body.first_size(response, length)
            if "ContentLength" not in response:  # no length promised: the body is read to its end
                whole = response["Body"].read()
                return Head(whole, len(whole) if total is None else total, None, etag)
            promised = int(response["ContentLength"])
            size = promised if total is None else total  # a whole object, when the server ignores ranges
            data = bytearray(min(promised, length if keep is None else keep))  # never more than asked for
            if len(data) == promised:
                read_body(response, [memoryview(data)])
                return Head(bytes(data), size, None, etag)
            read_start(response, [memoryview(data)])
            if keep is None:  # a server that ignores ranges sends more: that is not read
                let_go(response)
                return Head(bytes(data), size, None, etag)
            return Head(bytes(data), size, OpenBody(response, len(data), promised, self.open_bodies.release), etag)

        # Not counted in the requests in flight: a few KiB, to start the large ones sooner; what is left of a first
        # part is counted as it is read.
        try:
            head = self.request(first, url=url, doing=f"reading its first {length} bytes (GetObject)")
        except BaseException:
            if held:
                self.open_bodies.release()
            raise
        if held and head.body is None:
            self.open_bodies.release()
        return head if head.size >= 0 else Head(b"", self.size(key, url=url, version=version), None, None)

    def unfinished_uploads(self, prefix: str, *, url: str) -> list[dict[str, Any]]:
        """The multipart uploads started under ``prefix`` and neither completed nor aborted.

        ``Key``, ``UploadId``, ``Initiated`` (the server's time).
        """
        found: list[dict[str, Any]] = []
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        while True:
            page = self.request(
                lambda: self.client.list_multipart_uploads(**arguments), url=url, doing="listing unfinished uploads"
            )
            found.extend(page.get("Uploads", []))
            if not page.get("IsTruncated"):
                return found
            arguments.update(KeyMarker=page["NextKeyMarker"], UploadIdMarker=page["NextUploadIdMarker"])

    def abort_uploads_to(self, key: str, *, url: str) -> None:
        """Abort every unfinished multipart upload to exactly ``key`` (not those to keys that start with it)."""
        self.abort_uploads([up for up in self.unfinished_uploads(key, url=url) if up["Key"] == key], url=url)

    def abort_uploads(self, uploads: Sequence[dict[str, Any]], *, url: str) -> None:
        """Abort the given multipart uploads; their parts are deleted, and an upload gone already is no error."""
        for upload in uploads:

            def abort(upload: dict[str, Any] = upload) -> None:
                try:
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                except Exception as error:
                    if error_code(error) != "NoSuchUpload":
                        raise

            with contextlib.suppress(PathNotFoundError):
                self.request(abort, url=url, doing=f"aborting the upload of {upload['Key']}")


def _copy(data: bytes, offset: int, views: Sequence[memoryview]) -> None:
    """Fill ``views``, one after another, with the bytes of ``data`` from ``offset`` on."""
    whole = memoryview(data)
    for view in views:
        view[:] = whole[offset : offset + len(view)]
        offset += len(view)


class S3Object(SourceBase):
    """One object of a bucket, read by ranged GETs on the shared lanes of its :class:`Transfer`.

    Opening it reads its first :data:`HEAD_BYTES`, which tell its size and hold a jaxstow header of up to that size, so
    opening and reading the header take one request. With ``first`` larger, that request asks for the object's first
    ``first`` bytes and leaves what follows its head unread until a read asks for it: a file read from its start on
    (a step's item) gets its header and its first part of data from one request, and its later parts from requests
    that start where the transfer's parts of the object do.
    """

    def __init__(
        self, bucket: S3Bucket, key: str, *, name: str, version: str | None = None, first: int = HEAD_BYTES
    ) -> None:
        self.name = name
        self.parallel = bucket.lanes.reads
        self._bucket = bucket
        self._key = key
        self._version = version
        self._lock = threading.Lock()
        self._closed = False
        keep = HEAD_BYTES if first > HEAD_BYTES else None
        self._head, self.size, self._open, self._etag = bucket.head(
            key, max(first, HEAD_BYTES), url=name, version=version, keep=keep
        )

    def read_into(self, offset: int, buffer: memoryview) -> None:
        self.read_scatter(offset, [buffer])

    def read_scatter(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers``, one after another, with the bytes from ``offset`` on: one request (none for bytes of the
        head, or of the first request's body not read yet)."""
        views = [buffer.cast("B") for buffer in buffers]
        wanted = sum(len(view) for view in views)
        head = self._head
        if offset + wanted <= len(head):
            _copy(head, offset, views)
            return
        if offset + wanted > self.size:  # the object ends before: damage, found without asking the store
            raise self._truncated(offset, wanted, max(0, self.size - offset))
        done = self._from_open_body(offset, views) if self._open is not None else 0
        if done == wanted:
            return
        rest = views_after(views, done)  # every byte of it, or an error: the object has ``size`` bytes
        try:
            self._bucket.get_into(
                self._key, offset + done, rest, url=self.name, version=self._version, etag=self._etag, size=self.size
            )
        except PathNotFoundError:
            raise PathNotFoundError(_DELETED, file=self.name) from None

    def _from_open_body(self, offset: int, views: list[memoryview]) -> int:
        """How many of the bytes wanted from ``offset`` on came from the head and the first request's open body.

        The body serves a read that asks for the bytes where it stands, or for bytes of the head and those after it;
        one read at a time, and the others ask the store.
        """
        wanted = sum(len(view) for view in views)
        with self._lock:
            body, head = self._open, self._head
            if body is None or not offset <= body.position < offset + wanted:
                return 0
            if offset < body.position and body.position != len(head):  # bytes before it not in the head
                return 0
            self._open = None
        done = body.position - offset
        _copy(head, offset, views_before(views, done))
        lanes = self._bucket.lanes
        try:
            with lanes.reading:
                if lanes.read_pace is not None:
                    lanes.read_pace.wait(min(wanted - done, body.end - body.position))
                done += body.read_into(views_after(views, done))
        except BrokenBody as broken:  # closed: the rest is asked for, under the retry policy
            return done + broken.count
        with self._lock:
            if not body.ended and not self._closed:
                self._open, body = body, None
        if body is not None:
            body.close()
        return done

    def forget(self) -> bool:
        """Drop the first request's bytes and the rest of its body: every byte read from now on is asked for again,
        from the object of the first answer's ETag."""
        with self._lock:
            body, self._open, self._head = self._open, None, b""
        if body is not None:
            body.close()
        return True

    def close(self) -> None:
        """Drop the first request's body if it is not read to its end; the connections belong to the shared client."""
        with self._lock:
            body, self._open, self._closed = self._open, None, True
        if body is not None:
            body.close()
