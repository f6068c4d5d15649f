r"""Names read from a file that name files or folders of one folder: plain names in it, never paths out of it.

A step's record names its item files, a store's marker and ``.jaxstow-writing`` the files of their folder, a store's
``.jaxstow-recent.json`` the folders of its run, an index or an orbax step its files and item folders. A folder
made elsewhere is untrusted input, and ``..``, a folder separator (``/`` or ``\``), an absolute path or a NUL in
such a name would lead a read, a write or a deletion outside the folder, so such a name is refused wherever it is
read, with an error naming the file that holds it. An orbax leaf's name is a path in its folder (``params/w``):
:func:`is_member_path` refuses one that leads out. :func:`is_inside` tells whether a path, its links followed, stays in
its folder.

>>> is_member_name("params.safetensors"), is_member_name("../2/params.safetensors"), is_member_name("..\\x")
(True, False, False)
>>> is_member_path("params/dense.kernel"), is_member_path("params/../../x"), is_member_path("/etc/passwd")
(True, False, False)
>>> check_member_name("../../elsewhere", file="s3://bucket/run/3/checkpoint.json")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: s3://bucket/run/3/checkpoint.json: names '../../elsewhere', which leads outside the folder: ...
"""

from __future__ import annotations

import os
from typing import TypeGuard

from jaxstow.errors import FormatError, excerpt

__all__ = ["check_member_name", "is_inside", "is_member_name", "is_member_path"]


def is_member_name(name: object) -> TypeGuard[str]:
    """Whether ``name`` names a file or folder in a folder: a non-empty string, not ``.`` or ``..``, without ``/``,
    ``\\`` or NUL."""
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def is_member_path(name: object) -> TypeGuard[str]:
    """Whether ``name`` is a path within a folder: not absolute, no ``..`` among its parts (split at ``/`` or ``\\``),
    no NUL."""
    return (
        isinstance(name, str)
        and "\0" not in name
        and not name.startswith(("/", "\\"))
        and ".." not in name.replace("\\", "/").split("/")
    )


def check_member_name(name: object, *, file: str) -> str:
    """``name``, read from ``file``, if :func:`is_member_name`; a :class:`~jaxstow.errors.FormatError` naming
    ``file``, the name and that it leads outside the folder else."""
    if is_member_name(name):
        return name
    raise FormatError(
        f"names {excerpt(name)}, which leads outside the folder: a file names another of its folder by its name "
        "alone, without '/', '\\', '..' or a NUL; the file is damaged or was made to reach elsewhere: do not use "
        "this folder, or delete the file that holds the name",
        file=file,
    )


def is_inside(path: str, root: str) -> bool:
    """Whether the real path ``path`` lies in the folder whose real path is ``root`` (``root`` itself does not)."""
    return path != root and os.path.commonpath([path, root]) == root
