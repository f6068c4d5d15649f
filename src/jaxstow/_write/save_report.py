"""What a save reports: its start and end in the ``jaxstow`` log (bytes, seconds, rate), and a progress bar if asked.

>>> import io
>>> from jaxstow._write.save_report import SaveReport
>>> report = SaveReport("saving step 1", total=5)
>>> _ = report.sink(io.BytesIO()).write(b"hello")
>>> report.written
5
>>> seconds = report.finish()
"""

from __future__ import annotations

import logging
import time
from typing import BinaryIO

from jaxstow._util.progress import Bar, counted, format_bytes

__all__ = ["SaveReport"]

logger = logging.getLogger(__name__)


class SaveReport:
    """Progress of one job that writes ``total`` bytes of arrays (plus headers): logged, and drawn as a bar if ``bar``.

    Wrap each sink with :meth:`sink` so that its writes are counted.
    """

    def __init__(self, what: str, *, total: int, bar: bool = False) -> None:
        self.what = what
        self._start = time.perf_counter()
        self._bar = Bar(total, what, enabled=bar)
        logger.info("%s: saving %s of arrays", what, format_bytes(total))

    @property
    def written(self) -> int:
        """Bytes written so far."""
        return self._bar.done

    def sink(self, file: BinaryIO) -> BinaryIO:
        """``file``, with every write counted."""
        return counted(file, self._bar)

    def finish(self) -> float:
        """Log the end of the job; returns its duration in seconds."""
        seconds = time.perf_counter() - self._start
        self._bar.close()
        rate = format_bytes(self.written / seconds) if seconds > 0 else "-"
        logger.info("%s: done, %s written in %.2f s (%s/s)", self.what, format_bytes(self.written), seconds, rate)
        return seconds
