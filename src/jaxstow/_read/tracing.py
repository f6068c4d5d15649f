"""Restores while jax traces: refused for a user's (the arrays would be baked into the trace), run for jaxstow's own.

>>> import jax, jax.numpy as jnp, io, jaxstow
>>> from jaxstow._read.tracing import read_while_tracing
>>> buffer = io.BytesIO(); jaxstow.save(buffer, {"w": jnp.ones(2)})
>>> def traced(x):
...     _ = buffer.seek(0)
...     with read_while_tracing():  # jaxstow's own read, whose values are meant to be the traced program's
...         return x + jaxstow.load(buffer)["w"]
>>> jax.jit(traced)(jnp.zeros(2))
Array([1., 1.], dtype=float32)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["READING_WHILE_TRACING", "read_while_tracing"]

#: Set within :func:`read_while_tracing`.
READING_WHILE_TRACING: contextvars.ContextVar[bool] = contextvars.ContextVar("jaxstow_reading", default=False)


@contextlib.contextmanager
def read_while_tracing() -> Iterator[None]:
    """Within it, restores run while jax traces: for jaxstow's own reads at trace time, such as ``io.save``'s
    ``init_save`` taking up a chain from its checkpoint, whose values are meant to be the traced program's."""
    token = READING_WHILE_TRACING.set(True)
    try:
        yield
    finally:
        READING_WHILE_TRACING.reset(token)
