"""What a write to an object store leaves behind, removed at once where it can be, else by the next writer.

Once a folder's marker is written the folder is committed: its ``WRITING`` mark and, where it replaced a folder, the
files of the version before are leftovers. A failure to remove them (a store that keeps failing its deletes) is no
failure of the write, whose files stay whole; nor is the failure to remove a write that failed, whose own error is the
one to raise. Each is logged as a warning, and the next writer's cleanup removes what stayed.

>>> import fsspec
>>> fs = fsspec.filesystem("memory")
>>> fs.pipe_file("/leftovers-doc/1/old.safetensors", b"old")
>>> with removing("memory://leftovers-doc/1"):
...     fs.rm("/leftovers-doc/1/old.safetensors")
>>> fs.exists("/leftovers-doc/1/old.safetensors")
False
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from jaxstow._storage.remote import storage_errors
from jaxstow.errors import StorageError

__all__ = ["removing"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def removing(url: str) -> Iterator[None]:
    """Run the block that removes leftovers of the folder at ``url``; a failure of the storage is logged, not raised."""
    try:
        with storage_errors(url):
            yield
    except StorageError as error:
        logger.warning("%s: leftovers of a write stay there, for the next writer to remove: %s", url, error)
