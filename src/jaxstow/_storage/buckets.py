"""Buckets of object stores (``s3://``, ``gs://``, ``az://``): a URL in one that does not exist is an error that names
the bucket, not a missing file.

>>> from jaxstow._storage.buckets import nothing_at
>>> print(nothing_at("s3://bucket/model.jxs"))
s3://bucket/model.jxs: no such file or folder
"""

from __future__ import annotations

from typing import Any

from jaxstow.errors import PathNotFoundError

__all__ = ["bucket_missing", "nothing_at"]

#: The schemes of object stores, whose paths start with a bucket (or container).
_BUCKETED = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")


def nothing_at(url: str, *, bucket_missing: bool = False) -> PathNotFoundError:
    """The error of nothing at ``url``; where the store has no bucket of the URL's name, one that names the bucket.

    >>> from jaxstow._storage.buckets import nothing_at
    >>> print(nothing_at("s3://mdoels/run/1", bucket_missing=True))
    s3://mdoels/run/1: no bucket 'mdoels': the storage has none of that name (or hides it from these credentials); check the URL's bucket, or create it
    """
    if not bucket_missing:
        return PathNotFoundError("no such file or folder", file=url)
    bucket = url.partition("://")[2].partition("/")[0]
    return PathNotFoundError(
        f"no bucket {bucket!r}: the storage has none of that name (or hides it from these credentials); check the "
        "URL's bucket, or create it",
        file=url,
    )


def bucket_missing(fs: Any, root: str) -> bool:
    """Whether ``fs``, an object store (its paths start with a bucket: ``s3://``, ``gs://``, ``az://``), says it has no
    bucket ``root`` is in (one request). Any other answer is no: credentials allowed to reach the objects of a bucket
    need not be allowed to look at the bucket itself."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    if not set(protocols) & set(_BUCKETED):
        return False
    try:
        fs.info(root.partition("/")[0])
    except FileNotFoundError:
        return True
    except Exception:  # refused (PermissionError), or out of reach: the request the caller makes next says so
        return False
    return False
