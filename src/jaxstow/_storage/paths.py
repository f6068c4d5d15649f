"""What users name a file with: a local path, a ``file://`` URL, an fsspec URL or a binary file object.

The names are :mod:`jaxstow._storage.opening`'s, where a name is also resolved for reading; they are here too for the
modules that import them from here.
"""

from __future__ import annotations

from jaxstow._storage.opening import PathOrFile, display_name, local_path

__all__ = ["PathOrFile", "display_name", "local_path"]
