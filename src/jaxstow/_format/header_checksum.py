"""The checksum a jaxstow file's header ends with, read without parsing the header: what a local copy of a remote file
and a step's record are matched with the file by.
"""

from __future__ import annotations

from jaxstow._format.header import check_header_checksum, claims_manifest, raw_header
from jaxstow._format.source import ReadSource
from jaxstow.errors import FormatError

__all__ = ["header_checksum"]


def header_checksum(source: ReadSource) -> str:
    """The checksum a jaxstow file's header ends with, checked against the header text without parsing it.

    >>> import io, numpy as np
    >>> from jaxstow._format.native import write_native
    >>> from jaxstow._storage.opening import open_source
    >>> buffer = io.BytesIO()
    >>> written = write_native(buffer, [("w", np.zeros(2))], {"format": "jaxstow"})
    >>> _ = buffer.seek(0)
    >>> header_checksum(open_source(buffer)) == written
    True
    """
    raw = raw_header(source)
    if not claims_manifest(raw):
        raise FormatError("not a jaxstow file: its header has no jaxstow manifest", file=source.name)
    return check_header_checksum(raw, file=source.name)
