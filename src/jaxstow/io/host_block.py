"""A host callback for blocks of samples that hands the host the arrays XLA copied out, without copying them again.

``jax.pure_callback`` puts every operand on the CPU device (``jax.device_put``) before calling its function, which
copies a block of samples a second time on the host. :func:`send_block` is the same callback without that step: a
primitive lowered, as ``pure_callback`` is, to XLA's Python host callback, whose function receives the numpy arrays
XLA made. Like ``pure_callback`` it is free of side effects for XLA, so it costs nothing at the steps of a loop that
do not call it, and in a computation sharded over several devices it runs once, on one of them; its answer orders
the calls.

>>> import jax, jax.numpy as jnp, numpy as np
>>> from jaxstow.io.host_block import send_block
>>> received = []
>>> def receive(numbers, *leaves):
...     received.append((numbers.tolist(), [leaf.sum() for leaf in leaves]))
...     return np.zeros(numbers.shape[1:], np.int32)
>>> send = lambda x: send_block(receive, jnp.arange(4), [x, 2 * x])
>>> jax.jit(send)(jnp.ones(3)).block_until_ready(), received
(Array(0, dtype=int32), [([0, 1, 2, 3], [np.float32(3.0), np.float32(6.0)])])
>>> send(jnp.ones(3)), received[1:]  # outside jit it calls receive at once
(Array(0, dtype=int32), [([0, 1, 2, 3], [np.float32(3.0), np.float32(6.0)])])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow._util import jax_compat

__all__ = ["send_block"]

#: ``receive(numbers, *leaves)`` on the host, with numpy arrays; answers int32 of shape ``numbers.shape[1:]``.
Receive = Callable[..., np.ndarray]

_send_block_p = jax_compat.new_primitive("jaxstow_send_block")


def send_block(receive: Receive, numbers: jax.Array, leaves: Sequence[jax.Array]) -> jax.Array:
    """Call ``receive(numbers, *leaves)`` on the host; returns its answer, int32 of shape ``numbers.shape[1:]``."""
    answer: jax.Array = _send_block_p.bind(numbers, *leaves, receive=receive)
    return answer


def _answer_spec(numbers: Any, *leaves: Any, receive: Receive) -> Any:
    del leaves, receive
    return jax_compat.shaped_array(numbers.shape[1:], jnp.int32)


def _call_now(numbers: Any, *leaves: Any, receive: Receive) -> jax.Array:
    """Outside jit: call ``receive`` at once."""
    return jnp.asarray(receive(np.asarray(numbers), *(np.asarray(leaf) for leaf in leaves)), jnp.int32)


def _lower(ctx: Any, *operands: Any, receive: Receive) -> Any:
    return jax_compat.emit_host_callback(ctx, lambda *arrays: (receive(*arrays),), operands)


_send_block_p.def_abstract_eval(_answer_spec)
_send_block_p.def_impl(_call_now)
jax_compat.register_uncached_lowering(_send_block_p, _lower)
