"""Progress bars for long reads and writes: bytes done, rate and time left, drawn by tqdm on stderr.

:func:`bar` yields an object whose :meth:`~Bar.update` counts bytes; when progress is not wanted it draws nothing
and costs nothing, so callers use it unconditionally. :func:`counted` wraps a file so that every write is counted.

>>> import io
>>> from jaxstow._util import progress
>>> with progress.bar(5, "saving weights.jxs", enabled=False) as bytes_done:
...     _ = progress.counted(io.BytesIO(), bytes_done).write(b"hello")
>>> bytes_done.done
5
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO, cast

from jaxstow._util.optional import require

__all__ = ["Bar", "bar", "counted", "format_bytes", "require_progress_bar"]


def require_progress_bar() -> None:
    """Raise :class:`~jaxstow.errors.MissingDependencyError` when ``tqdm``, which draws progress bars, is missing."""
    require("tqdm", extra="progress", purpose="a progress bar")


def format_bytes(count: float) -> str:
    """A byte count for people.

    >>> from jaxstow._util.progress import format_bytes
    >>> format_bytes(512), format_bytes(1_113_731_072)
    ('512 B', '1.11 GB')
    """
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


class Bar:
    """Counts the bytes of one job (``done``) and, when drawn, shows them against ``total`` with rate and time left.

    Threads reading parts of the job may count on it at once.
    """

    def __init__(self, total: int, description: str, *, enabled: bool) -> None:
        self.total = total
        self.done = 0
        self._lock = threading.Lock()
        self._tqdm: Any = None
        if enabled:
            require_progress_bar()
            from tqdm.auto import tqdm

            self._tqdm = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc=description, leave=False)

    def update(self, nbytes: int) -> None:
        """Count ``nbytes`` more bytes as done."""
        with self._lock:
            self.done += nbytes
            if self._tqdm is not None:
                self._tqdm.update(nbytes)

    def close(self) -> None:
        """Stop drawing; the bar ends at what was done (headers come on top of the arrays' bytes)."""
        with self._lock:
            if self._tqdm is not None:
                self._tqdm.total = max(self.done, self._tqdm.total)
                self._tqdm.refresh()
                self._tqdm.close()
                self._tqdm = None


@contextlib.contextmanager
def bar(total_bytes: int, description: str, enabled: bool) -> Iterator[Bar]:
    """A progress bar of ``total_bytes`` named ``description``, drawn only if ``enabled`` (which needs tqdm).

    >>> from jaxstow._util import progress
    >>> with progress.bar(10, "reading", enabled=False) as bytes_done:
    ...     bytes_done.update(4)
    >>> bytes_done.done, bytes_done.total
    (4, 10)
    """
    drawn = Bar(total_bytes, description, enabled=enabled)
    try:
        yield drawn
    finally:
        drawn.close()


def counted(file: BinaryIO, bar: Bar) -> BinaryIO:
    """``file``, with the bytes of every write counted on ``bar``."""
    return cast(BinaryIO, _CountingSink(file, bar))


class _CountingSink:
    """A write-only file that passes every write on and counts it."""

    def __init__(self, file: BinaryIO, bar: Bar) -> None:
        self._file = file
        self._bar = bar
        self.name = getattr(file, "name", "")

    def write(self, data: Any) -> int:
        written = self._file.write(data)
        count = memoryview(data).nbytes if written is None else written
        self._bar.update(count)
        return count

    def flush(self) -> None:
        self._file.flush()

    @property
    def raw(self) -> Any:
        """The raw file beneath, as a buffered file's: what the file counted writes to."""
        return getattr(self._file, "raw", self._file)

    def seekable(self) -> bool:
        return bool(getattr(self._file, "seekable", lambda: False)())

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()
