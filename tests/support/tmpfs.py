"""A real small tmpfs for the tests of a full disk and a read-only folder.

``mount -t tmpfs -o size=1m`` needs root (the suite runs as root here); where ``mount`` is refused the test is skipped
with the reason. The file system is unmounted when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str = "1m", inodes: int | None = None) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` (and at most ``inodes`` files, if given) mounted at ``folder`` (made if missing)
    while the block runs."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount")
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + ("" if inodes is None else f",nr_inodes={inodes}")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount refused a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], capture_output=True, check=False)


def make_read_only(folder: Path) -> None:
    """Remount the tmpfs at ``folder`` read-only: file modes do not stop root, a read-only file system does."""
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True, check=True)


def leftovers(folder: Path) -> list[str]:
    """The temporary names jaxstow writes under, anywhere under ``folder``."""
    return [name for _, folders, files in os.walk(folder) for name in folders + files if ".jaxstow-tmp-" in name]
