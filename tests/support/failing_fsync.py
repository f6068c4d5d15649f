"""An fsync of one folder that fails with EIO, as a failing device's would: no file system here fails one on request.

``os.fsync`` of that folder's descriptor alone fails; every other fsync (of files, of other folders) is the system's
own. The patch holds for the test (``monkeypatch``), in this process only.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest


def failing_fsync(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path | None], None]:
    """``fail(folder)``: from then on, an fsync of ``folder`` fails with EIO; ``fail(None)`` ends it."""
    real = os.fsync
    failing: list[str] = []

    def fsync(descriptor: int) -> None:
        if failing and os.readlink(f"/proc/self/fd/{descriptor}") == failing[0]:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(descriptor)

    def fail(folder: Path | None) -> None:
        failing[:] = [] if folder is None else [str(folder)]

    monkeypatch.setattr(os, "fsync", fsync)
    return fail
