"""One object uploaded to S3 all or nothing: in parts, many at once, visible only once :meth:`S3Upload.commit` ends.

What is written is cut into parts of ``part_size`` without a copy (views of the writer's buffers, untouched until the
upload ends) and sent ``requests`` at a time from the shared pool; a writer that gets ahead waits, so no more than
``requests`` parts are held. An object of one part is one PUT, looked up (``HeadObject``) once acknowledged and sent
again while the store does not hold it as sent (:class:`NotKept`). Any failure aborts the upload, so the object never
appears torn; a killed process's unfinished upload is aborted by the next save to the same key
(:func:`jaxstow._storage.sinks.object_sink`) or by ``jaxstow uploads --abort``. Every request is retried under the
bucket's policy (:meth:`S3Bucket.request`), as the reads are; a start sent again (its answer may have been lost after
the store started an upload) is followed by the abort of the key's other unfinished uploads.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import threading
from collections.abc import Sequence
from concurrent.futures import Future, wait
from typing import Any

from jaxstow._format.source import SourceFile
from jaxstow._storage.retrying import error_code
from jaxstow._storage.s3 import S3Bucket
from jaxstow._storage.sources import SourceBase
from jaxstow.errors import StorageError

__all__ = ["S3Upload"]

_MAX_PART = 5 << 30  # S3's largest part
_GROWTH = 1000  # parts of one size before the size doubles: 10,000 parts hold 1023 x 1000 x part_size


class S3Upload:
    """A write-only binary sink whose bytes become the object ``key`` of ``bucket`` at :meth:`commit`."""

    def __init__(self, bucket: S3Bucket, key: str, *, url: str) -> None:
        self.name = url
        self._bucket = bucket
        self._key = key
        self._lanes = bucket.lanes
        self._pending: list[memoryview] = []
        self._pending_bytes = 0
        self._written = 0
        self._upload_id: str | None = None
        self._starting = False  # CreateMultipartUpload was sent
        self._parts: list[Future[dict[str, Any]]] = []
        self._failed = threading.Event()
        self.closed = False

    # The file protocol, as far as a writer uses it.

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        """Nothing to do: parts go as soon as they are full."""

    def write(self, data: Any) -> int:
        """Take ``data`` (kept as a view: leave it unchanged until the upload ends) and send every full part."""
        if self._failed.is_set():
            self._raise_failure()
        view = memoryview(data).cast("B")
        if view.nbytes:
            self._pending.append(view)
            self._pending_bytes += view.nbytes
            self._written += view.nbytes
        while self._pending_bytes >= self._part_size():
            self._send(self._take(self._part_size()))
        return view.nbytes

    # The parts.

    def _part_size(self) -> int:
        return min(self._lanes.transfer.part_size << (len(self._parts) // _GROWTH), _MAX_PART)

    def _take(self, size: int) -> list[memoryview]:
        """The first ``size`` pending bytes, as views."""
        taken: list[memoryview] = []
        left = size
        while left:
            view = self._pending[0]
            if view.nbytes <= left:
                taken.append(self._pending.pop(0))
                left -= view.nbytes
            else:
                taken.append(view[:left])
                self._pending[0] = view[left:]
                left = 0
        self._pending_bytes -= size
        return taken

    def _send(self, views: list[memoryview]) -> None:
        if self._upload_id is None:
            bucket = self._bucket
            self._starting = True  # an interrupt before the answer is kept leaves an upload of unknown id: see abort
            sent = 0

            def start() -> str:
                nonlocal sent
                sent += 1
                answer = bucket.client.create_multipart_upload(
                    Bucket=bucket.bucket, Key=self._key, **bucket.extra("CreateMultipartUpload")
                )
                return str(answer["UploadId"])

            self._upload_id = bucket.request(start, url=self.name, doing="starting the upload (CreateMultipartUpload)")
            if sent > 1:  # an answer that failed may have been lost after the store started an upload: abort it
                others = bucket.unfinished_uploads(self._key, url=self.name)
                bucket.abort_uploads(
                    [up for up in others if up["Key"] == self._key and up["UploadId"] != self._upload_id], url=self.name
                )
        self._lanes.uploading.acquire()
        if self._failed.is_set():
            self._lanes.uploading.release()
            self._raise_failure()
        number = len(self._parts) + 1
        future = self._lanes.upload(self._upload_part, number, views)
        future.add_done_callback(self._part_done)
        self._parts.append(future)

    def _upload_part(self, number: int, views: list[memoryview]) -> dict[str, Any]:
        source = ViewsSource(views)
        if self._lanes.write_pace is not None:
            self._lanes.write_pace.wait(source.size)
        bucket = self._bucket
        answer = bucket.request(
            lambda: bucket.client.upload_part(
                Bucket=bucket.bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=SourceFile(source),
                ContentLength=source.size,
                **bucket.extra("UploadPart"),
            ),
            url=self.name,
            doing=f"uploading part {number} (UploadPart)",
        )
        part = {"PartNumber": number, "ETag": answer["ETag"]}
        part.update({name: value for name, value in answer.items() if name.startswith("Checksum")})
        return part

    def _part_done(self, future: Future[dict[str, Any]]) -> None:
        self._lanes.uploading.release()
        if future.cancelled() or future.exception() is not None:
            self._failed.set()

    def _raise_failure(self) -> None:
        for future in self._parts:
            if future.done() and not future.cancelled() and (error := future.exception()) is not None:
                if isinstance(error, StorageError):  # a request's failure, which names the file and what was done
                    raise error
                raise StorageError(f"uploading it failed: {error}", file=self.name) from error
        raise StorageError("uploading it failed", file=self.name)

    # The end.

    def finish(self) -> None:
        """Send what is left (the last part, or the whole object as one PUT) without waiting for it."""
        try:
            if self._upload_id is None:
                views = self._take(self._pending_bytes)
                self._lanes.uploading.acquire()
                future = self._lanes.upload(self._put_whole, views)
                future.add_done_callback(self._part_done)
                self._parts.append(future)
            elif self._pending_bytes:
                self._send(self._take(self._pending_bytes))
        except BaseException:
            self.abort()
            raise

    def complete(self) -> None:
        """Wait for the parts sent, then make the object appear whole (the completion of the multipart upload)."""
        try:
            wait(self._parts)
            if self._failed.is_set():
                self._raise_failure()
            if self._upload_id is not None:
                parts = [future.result() for future in self._parts]
                bucket = self._bucket
                bucket.request(
                    lambda: bucket.client.complete_multipart_upload(
                        Bucket=bucket.bucket,
                        Key=self._key,
                        UploadId=self._upload_id,
                        MultipartUpload={"Parts": parts},
                        **bucket.extra("CompleteMultipartUpload"),
                    ),
                    url=self.name,
                    doing="completing the upload (CompleteMultipartUpload)",
                )
        except BaseException:
            self.abort()
            raise
        self.closed = True
        self._upload_id, self._starting = None, False  # complete: nothing left to abort

    def commit(self) -> None:
        """:meth:`finish`, then :meth:`complete`: the object is there when this returns."""
        self.finish()
        self.complete()

    def _put_whole(self, views: list[memoryview]) -> dict[str, Any]:
        source = ViewsSource(views)
        if self._lanes.write_pace is not None:
            self._lanes.write_pace.wait(source.size)
        bucket = self._bucket

        def put() -> None:
            answer = bucket.client.put_object(
                Bucket=bucket.bucket,
                Key=self._key,
                Body=SourceFile(source),
                ContentLength=source.size,
                **bucket.extra("PutObject"),
            )
            self._check_kept(source.size, answer.get("ETag"))

        bucket.request(put, url=self.name, doing="uploading it (PutObject, then HeadObject)")
        return {}

    def _check_kept(self, size: int, etag: str | None) -> None:
        """Raise :class:`NotKept` unless the bucket holds the object just acknowledged: ``size`` bytes, with the ETag
        the PUT's answer gave (when it gave one)."""
        bucket = self._bucket
        try:
            held = bucket.client.head_object(Bucket=bucket.bucket, Key=self._key, **bucket.extra("HeadObject"))
        except Exception as error:
            if error_code(error) not in ("404", "NoSuchKey", "NotFound"):
                raise
            held = None
        if held is not None and held.get("ContentLength") == size and etag in (None, held.get("ETag")):
            return
        what = "no object" if held is None else f"another object of {held.get('ContentLength')} bytes"
        name = self._key.rpartition("/")[2]
        raise NotKept(
            f"the store acknowledged {name} but does not keep it: {size} bytes sent, and it holds {what} there"
        )

    def abort(self) -> None:
        """Drop the parts not yet sent and abort the multipart upload.

        Idempotent; never raises for a server that cannot be reached, whose upload then stays unfinished. An
        upload whose start was interrupted before its id was known (Ctrl-C while CreateMultipartUpload was answered)
        is found among the key's unfinished uploads and aborted with them.
        """
        self.closed = True
        for future in self._parts:
            future.cancel()
        wait(self._parts)
        self._pending.clear()
        upload_id, started = self._upload_id, self._starting
        self._upload_id, self._starting = None, False
        with contextlib.suppress(StorageError):
            if upload_id is not None:
                self._bucket.abort_uploads([{"Key": self._key, "UploadId": upload_id}], url=self.name)
            elif started:
                self._bucket.abort_uploads_to(self._key, url=self.name)


class NotKept(ConnectionError):
    """An object sent as one PUT that the store acknowledged, and does not hold as it was sent: a failure of the
    storage that may pass (a store that shows a new object a moment late), so the PUT is sent again."""


class ViewsSource(SourceBase):
    """Buffers one after another, read as one source with no copy until a piece is read.

    The body of a request is a :class:`~jaxstow._format.source.SourceFile` over it.
    """

    def __init__(self, views: Sequence[memoryview]) -> None:
        self.name = "<parts>"
        self._views = list(views)
        self._starts = [0, *itertools.accumulate(len(view) for view in self._views)]
        self.size = self._starts[-1]

    def read_into(self, offset: int, buffer: memoryview) -> None:
        target = buffer.cast("B")
        done = 0
        index = bisect.bisect_right(self._starts, offset) - 1
        while done < len(target):
            if index >= len(self._views):
                raise self._truncated(offset, len(target), done)
            view, start = self._views[index], self._starts[index]
            within = offset + done - start
            count = min(len(view) - within, len(target) - done)
            target[done : done + count] = view[within : within + count]
            done += count
            index += 1

    def close(self) -> None:
        """The buffers belong to their writer."""
