"""Building files as an attacker would: any header and manifest text, with a valid header checksum.

>>> import io, jaxstow
>>> from reliability.forge import forge_native
>>> data = forge_native({}, '{"format":"jaxstow","version":1,"structure":"*","leaves":[{"path":"","kind":"value","value":7}]}')
>>> jaxstow.load(io.BytesIO(data))
7
"""

from __future__ import annotations

import json
import struct
from typing import Any

from jaxstow._format.checksum import ZERO_CHECKSUM, checksum_bytes
from jaxstow._format.native import DATA_ALIGNMENT

__all__ = ["forge_native", "split_native"]

_HASH_KEY = "jaxstow_header_xxh3"
_TAIL = len(f'"{ZERO_CHECKSUM}"}}}}')


def forge_native(
    tensors: dict[str, Any], manifest_text: str | None, data: bytes = b"", *, plain: dict[str, str] | None = None
) -> bytes:
    """A native file whose header holds ``tensors`` (safetensors entries) and ``manifest_text`` as given, checksummed.

    ``manifest_text`` need not be valid JSON; the header checksum is computed exactly as jaxstow computes it.
    ``plain`` keys go into ``__metadata__`` between the manifest and the checksum, where format version 4 puts the
    user's string metadata.
    """
    header: dict[str, Any] = dict(tensors)
    if manifest_text is not None:
        header["__metadata__"] = {"jaxstow": manifest_text, **(plain or {}), _HASH_KEY: ZERO_CHECKSUM}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if manifest_text is not None:
        text = text[:-_TAIL] + f'"{checksum_bytes(text)}"}}}}'.encode()
    padded = len(text) + (-(8 + len(text)) % DATA_ALIGNMENT)
    return struct.pack("<Q", padded) + text.ljust(padded, b" ") + data


def split_native(file: bytes) -> tuple[dict[str, Any], str | None, bytes]:
    """The tensor entries, the manifest text and the data region of a native file (the inverse of :func:`forge_native`)."""
    (length,) = struct.unpack("<Q", file[:8])
    header = json.loads(file[8 : 8 + length])
    metadata = header.pop("__metadata__", {})
    return header, metadata.get("jaxstow"), file[8 + length :]
