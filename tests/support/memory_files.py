"""A tree saved into a file object in memory, rewound for a load to read it as a user reads a file object."""

from __future__ import annotations

import io
from typing import Any

import jaxstow


def saved_in_memory(tree: Any) -> io.BytesIO:
    """``tree`` saved with :func:`jaxstow.save` into a ``BytesIO``, rewound to its start."""
    buffer = io.BytesIO()
    jaxstow.save(buffer, tree)
    buffer.seek(0)
    return buffer
