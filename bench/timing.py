"""Helpers shared by the benchmark scripts: timed runs with their peak memory, fsync of outputs, warm caches, tables.

Peak memory is the kernel's own high-water mark of the process's resident set (``VmHWM``), reset to the current
resident set just before each run by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). A run's peak is
``VmHWM`` after it minus ``VmRSS`` before it: every byte the run touched at its worst moment, however short, and not a
sample that can miss a spike. Resident pages of memory-mapped files count too, as the kernel counts them. CPU seconds
(user + system, all threads) are reported beside wall-clock time: on a shared machine they show the work a method
does even when other processes slow its clock.

>>> sample = measure(lambda: bytearray(64 << 20))
>>> sample.seconds > 0, sample.peak_bytes >= 64 << 20
(True, True)
>>> print(format_table(["a", "b"], [["x", "1.0"], ["yy", "22.5"]]))
a      b
--  ----
x    1.0
yy  22.5
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["Sample", "format_table", "fsync_path", "measure", "median", "remove", "warm_cache", "warm_memory"]

_READ_CHUNK = 16 << 20


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class Sample(NamedTuple):
    """One measured run: wall-clock seconds, CPU seconds of all the process's threads, peak resident growth."""

    seconds: float
    cpu_seconds: float
    peak_bytes: int


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _release_free_memory() -> None:
    """Hand the allocator's free pages back to the system, so that a run's allocations count in its peak instead of
    reusing pages that an earlier run (or a tree let go of) left resident in the allocator."""
    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def warm_memory(nbytes: int) -> None:
    """Touch and free ``nbytes`` of fresh memory, so that the pages the next run gets are backed by the host.

    In a virtual machine that hands free pages back to its host (this one does, within seconds), touching them again
    costs about 3 s of system time per GiB, measured here: far more than the work being measured, and falling on
    whichever method happens to run after a pause.
    """
    if nbytes > 0:
        np.ones(nbytes, dtype=np.uint8)


def measure(
    run: Callable[[], object], inspect: Callable[[object], None] | None = None, *, warm_bytes: int = 0
) -> Sample:
    """Time ``run()`` and the peak of resident memory above what the process held before it.

    ``warm_bytes`` of memory are touched and freed just before (see :func:`warm_memory`); ``inspect``, if given, is
    called on the result after the measurement, before the result is let go.
    """
    _release_free_memory()
    warm_memory(warm_bytes)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status_bytes("VmRSS")
    cpu = _cpu_seconds()
    start = time.perf_counter()
    result = run()
    sample = Sample(time.perf_counter() - start, _cpu_seconds() - cpu, _status_bytes("VmHWM") - before)
    if inspect is not None:
        inspect(result)
    del result
    return sample


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Make a file, or a folder with everything in it, durable: fsync every file, every folder and the parent."""
    root = Path(path)
    folders = [root.parent]
    if root.is_dir():
        folders += [root, *(p for p in root.rglob("*") if p.is_dir())]
    for file in _files_under(root):
        descriptor = os.open(file, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    for folder in folders:
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def warm_cache(path: str | os.PathLike[str]) -> None:
    """Read every byte of a file or folder once, so that the restores after it all find it in the page cache."""
    chunk = bytearray(_READ_CHUNK)
    for file in _files_under(Path(path)):
        with open(file, "rb", buffering=0) as source:
            while source.readinto(chunk):
                pass


def remove(path: str | os.PathLike[str]) -> None:
    """Delete a file or a folder tree if it exists."""
    root = Path(path)
    if root.is_dir():
        shutil.rmtree(root)
    else:
        root.unlink(missing_ok=True)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = (str(cell) for cell in cells)
        parts = [first.ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(rest, widths[1:], strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * width for width in widths]), *(line(row) for row in rows)])
