"""What every entry point takes about where bytes live.

fsspec's storage options, the transfer settings and a local cache, checked once and carried together.

>>> from jaxstow._storage.settings import StorageSettings, storage_settings
>>> storage_settings(None, None, None) == StorageSettings()
True
>>> storage_settings({"anon": True}, None, "/tmp/cache").cache_dir
'/tmp/cache'
>>> storage_settings("anon", None, None)
Traceback (most recent call last):
...
jaxstow.errors.ArgumentError: storage_options must be a dict of fsspec options (such as {'key': ..., 'secret': ...}), not str
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxstow._storage.transfer import Transfer
from jaxstow.errors import ArgumentError

__all__ = ["StorageSettings", "storage_settings"]


@dataclass(frozen=True)
class StorageSettings:
    """Where bytes live: fsspec's ``options``, the :class:`~jaxstow.Transfer` and ``cache_dir``.

    ``cache_dir`` is a local folder keeping verified copies of the files read from a URL (``None``: no cache).
    """

    options: Mapping[str, Any] | None = field(default=None, hash=False)
    transfer: Transfer = field(default_factory=Transfer)
    cache_dir: str | None = None


def storage_settings(
    storage_options: Mapping[str, Any] | None,
    transfer: Transfer | None,
    cache_dir: str | os.PathLike[str] | None,
) -> StorageSettings:
    """The settings of one call, its arguments checked."""
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ArgumentError(
            "storage_options must be a dict of fsspec options (such as {'key': ..., 'secret': ...}), not "
            f"{type(storage_options).__name__}"
        )
    if transfer is not None and not isinstance(transfer, Transfer):
        raise ArgumentError(f"transfer must be a jaxstow.Transfer, not {type(transfer).__name__}")
    if cache_dir is not None and not isinstance(cache_dir, str | os.PathLike):
        raise ArgumentError(f"cache_dir must be the path of a local folder, not {type(cache_dir).__name__}")
    return StorageSettings(
        dict(storage_options) if storage_options else None,
        transfer or Transfer(),
        None if cache_dir is None else os.path.expanduser(os.fspath(cache_dir)),
    )
