"""What users name a file with: a local path, a ``file://`` URL, an fsspec URL or a binary file object.

>>> import io
>>> from jaxstow._storage.paths import display_name, local_path
>>> local_path("runs/a"), local_path("file:///tmp/runs"), local_path("s3://bucket/runs")
('runs/a', '/tmp/runs', None)
>>> display_name("runs/a/model.jxs"), display_name(io.BytesIO())
('runs/a/model.jxs', '<BytesIO>')
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO

__all__ = ["PathOrFile", "display_name", "local_path"]

PathOrFile = str | os.PathLike[str] | BinaryIO


def local_path(target: str | os.PathLike[str]) -> str | None:
    """The local path that ``target`` names (a path or a ``file://`` URL), or ``None`` for any other URL."""
    text = os.fspath(target)
    if text.startswith("file://"):
        return text.removeprefix("file://")
    return None if "://" in text else text


def display_name(target: Any) -> str:
    """How error messages name a path or a file object."""
    if isinstance(target, str | os.PathLike):
        return os.fspath(target)
    return str(getattr(target, "name", f"<{type(target).__name__}>"))
