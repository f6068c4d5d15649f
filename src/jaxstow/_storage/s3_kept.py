"""That an object sent as one PUT is in the bucket: a store that acknowledges a write it does not keep (the object
absent, or another one there) is a :class:`~jaxstow.errors.StorageError`, not a save that seems to have succeeded."""

from __future__ import annotations

import time
from typing import Any

from jaxstow._storage.retrying import error_code
from jaxstow._storage.s3 import S3Bucket
from jaxstow.errors import StorageError

__all__ = ["check_kept"]

_LOOKS = 3  # a store that shows a new object a moment late: asked again after 0.1 s, then 0.2 s


def check_kept(bucket: S3Bucket, key: str, etag: str | None, size: int, *, url: str) -> None:
    """Raise a :class:`StorageError` naming ``url`` unless the object ``key`` is there, ``size`` bytes, with the ETag
    the PUT's answer gave (when it gave one)."""
    arguments = {"Bucket": bucket.bucket, "Key": key, **bucket.extra("HeadObject")}

    def head() -> dict[str, Any] | None:
        try:
            return dict(bucket.client.head_object(**arguments))
        except Exception as error:
            if error_code(error) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    found: dict[str, Any] | None = None
    for look in range(_LOOKS):
        if look:
            time.sleep(0.1 * 2 ** (look - 1))
        found = bucket.request(head, url=url, doing="checking that the store keeps it (HeadObject)")
        if found is not None and found.get("ContentLength") == size and etag in (None, found.get("ETag")):
            return
    what = "it is not there" if found is None else "another object is there"
    raise StorageError(
        f"the store acknowledged {key.rpartition('/')[2]} but does not keep it ({what}): save it again, and check "
        "the store",
        file=url,
    )
