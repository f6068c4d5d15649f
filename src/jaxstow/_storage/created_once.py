"""An object written only where none is: on S3, a conditional PUT (``If-None-Match: *``, fsspec's ``"xb"`` mode).

A step's record is written so: a writer that lost the writer's lock (frozen past its lease while another host took
the lock over and saved the same step) cannot then write its record over the other writer's.

>>> import fsspec
>>> from jaxstow._storage.created_once import create_once
>>> fs = fsspec.filesystem("memory")
>>> create_once(fs, "/run/7/checkpoint.json", b"mine"), create_once(fs, "/run/7/checkpoint.json", b"theirs")
(True, False)
>>> fs.cat_file("/run/7/checkpoint.json")
b'mine'
"""

from __future__ import annotations

from typing import Any

from jaxstow.errors import CheckpointError

__all__ = ["committed_by_another", "create_once"]


def create_once(fs: Any, path: str, data: bytes) -> bool:
    """Write ``data`` as the object ``path`` of ``fs`` unless one is there: ``True`` where written (or where the
    object holds ``data`` already: this write's own PUT, sent again by the client after its answer was lost),
    ``False`` where another object is there. A store that cannot create only if absent writes it as ever."""
    try:
        with fs.open(path, "xb") as sink:
            sink.write(data)
    except ValueError:  # no "x" mode in this store
        fs.pipe_file(path, data)
    except OSError as error:  # FileExistsError, or the 412 of a store that does not say which condition failed
        fs.invalidate_cache(path)
        try:
            found = fs.cat_file(path)
        except FileNotFoundError:
            raise error from None  # nothing there: the write failed for another reason, which its error says
        return bool(found == data)
    return True


def committed_by_another(url: str) -> CheckpointError:
    """The error of a save whose step folder ``url`` another writer committed first."""
    return CheckpointError(
        f"{url} was committed by another writer while this one wrote it (this process was held up past the writer's "
        "lock's lease, and another host took the lock over): the step is that writer's, and this save is not kept",
        file=url,
    )
