"""Headers checked already, kept by their exact bytes: a file opened again skips parsing and checking its header.

What opening derives from a native header (its tensor table and ``__metadata__``, see
:func:`jaxstow._format.header.open_container`) is a function of the header's bytes and the file's size alone (the
file's name only appears in the errors, and errors are not kept), so it is kept under exactly those. The next open of
a file whose header reads the same, byte for byte, and whose size is the same takes it: the header is read again, its
JSON and tensor table not parsed and checked again. Only what passed every check is kept, and only parts nobody
changes; the data is read and verified against its checksums on every read, as before. At most :data:`KEPT_HEADERS`
headers of at most :data:`KEPT_HEADER_BYTES` bytes in all are kept, the least recently used going first; a forked
child starts with none.

>>> from jaxstow._format.header_cache import HeaderCache
>>> cache = HeaderCache(most=2, most_bytes=100)
>>> cache.keep(b'{"a":1}', 50, "checked")
>>> cache.get(b'{"a":1}', 50), cache.get(b'{"a":1}', 51), cache.get(b'{"a":2}', 50)
('checked', None, None)
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from xxhash import xxh3_64_intdigest

__all__ = ["KEPT_HEADERS", "KEPT_HEADER_BYTES", "HeaderCache", "process_wide"]

#: The most headers kept, and the most bytes of header text they take in all (what is derived from a header takes a
#: few times its text again). A header larger than that is not kept.
KEPT_HEADERS = 32
KEPT_HEADER_BYTES = 16 << 20

T = TypeVar("T")


class HeaderCache(Generic[T]):
    """What was derived from headers that passed every check, by their bytes and their file's size; thread-safe.

    Found by the xxh3 of the bytes and the size, then compared byte for byte with the header kept: a header that
    differs in any byte, or a file of another size, is never taken for one kept.
    """

    def __init__(self, most: int, most_bytes: int) -> None:
        self.most, self.most_bytes = most, most_bytes
        self.reset()

    def reset(self) -> None:
        """Start empty, with a lock of its own (in a forked child, whose parent's lock may be held by a thread gone)."""
        self.lock = threading.RLock()  # re-entrant: a collection started under it may run code that opens a file
        self.kept: OrderedDict[tuple[int, int], tuple[bytes, T]] = OrderedDict()
        self.held = 0

    def get(self, raw: bytes, size: int) -> T | None:
        """What was kept for the header ``raw`` of a file of ``size`` bytes, or ``None``."""
        key = (xxh3_64_intdigest(raw), size)
        with self.lock:
            found = self.kept.get(key)
            if found is None or found[0] != raw:
                return None
            self.kept.move_to_end(key)
            return found[1]

    def keep(self, raw: bytes, size: int, derived: T) -> None:
        """Keep ``derived``, what the header ``raw`` of a file of ``size`` bytes gave after passing every check."""
        if len(raw) > self.most_bytes:
            return
        raw = bytes(raw)
        key = (xxh3_64_intdigest(raw), size)
        gone = []
        with self.lock:
            before = self.kept.pop(key, None)
            self.held += len(raw) - (0 if before is None else len(before[0]))
            self.kept[key] = (raw, derived)
            while len(self.kept) > self.most or self.held > self.most_bytes:
                gone.append(self.kept.popitem(last=False)[1])
                self.held -= len(gone[-1][0])
        del before, gone  # let go outside the lock


def process_wide(most: int = KEPT_HEADERS, most_bytes: int = KEPT_HEADER_BYTES) -> HeaderCache[T]:
    """A cache for the whole process, emptied in a forked child."""
    cache: HeaderCache[T] = HeaderCache(most, most_bytes)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=cache.reset)
    return cache
