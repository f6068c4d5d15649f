"""The small objects of a checkpoint directory (its lock, its recent changes, a folder's marks), read through fsspec
under the :class:`~jaxstow.Transfer`'s retry policy, as data is: an answer whose body arrives damaged (botocore's
``FlexibleChecksumError``) or whose connection drops is asked for again.

>>> import jaxstow, fsspec
>>> from jaxstow._storage.small_reads import read_small
>>> fsspec.filesystem("memory").pipe_file("/jaxstow-doc/small.json", b"{}")
>>> read_small(fsspec.filesystem("memory"), "/jaxstow-doc/small.json", url="memory://jaxstow-doc/small.json",
...            transfer=jaxstow.Transfer())
b'{}'
"""

from __future__ import annotations

from typing import Any

from jaxstow._storage.transfer import Transfer

__all__ = ["read_small"]


def read_small(fs: Any, path: str, *, url: str, transfer: Transfer) -> bytes:
    """The whole object at ``path``; a missing one raises :class:`FileNotFoundError`, one that fails every time for
    a reason that passes a :class:`~jaxstow.errors.StorageError` naming ``url``."""
    return transfer.retries().call(lambda: bytes(fs.cat_file(path)), url=url, doing="reading it whole")
