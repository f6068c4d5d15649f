"""A host callback for blocks of samples that hands the host the run's own buffers on the CPU, and copies them once
from an accelerator.

``jax.pure_callback`` copies every operand into new host arrays (and puts them on the CPU device) before calling its
function: a block of samples lands in fresh memory at every call. :func:`send_block` spares that: on the CPU (jax
0.6.1 on) its function reads the block in place, in the buffer the run carries, through the callback that
``jax.experimental.buffer_callback`` uses; from an accelerator (or a computation sharded over several CPU devices,
whose partitioner would call that one on every device) it receives the host arrays XLA copied the block into. Either
way the arrays are valid only during the call: the function copies what it keeps. Like ``pure_callback`` it is free
of side effects for XLA, so it costs nothing at the steps of a loop that do not call it, and in a computation sharded
over several devices it runs once, on one of them; its answer orders the calls.

>>> import jax, jax.numpy as jnp, numpy as np
>>> from jaxstow.io.host_block import send_block
>>> received = []
>>> def receive(numbers, *leaves):
...     received.append((numbers.tolist(), [leaf.sum() for leaf in leaves]))   # copies what it keeps
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

#: ``receive(numbers, *leaves)`` on the host, with numpy arrays valid during the call; answers int32 of shape
#: ``numbers.shape[1:]``.
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


def _lower_copied(ctx: Any, *operands: Any, receive: Receive) -> Any:
    """The block copied to the host by XLA (any platform)."""
    return jax_compat.emit_host_callback(ctx, lambda *arrays: (receive(*arrays),), operands)


def _lower_in_place(ctx: Any, *operands: Any, receive: Receive) -> Any:
    """On the CPU, in a computation on one device: the block read in place, and the answer written into the
    result's buffer."""
    if not jax_compat.lowers_for_one_device(ctx):
        return _lower_copied(ctx, *operands, receive=receive)

    def call(*buffers: Any) -> None:
        *arrays, answer = (np.asarray(buffer) for buffer in buffers)
        answer[...] = receive(*arrays)

    return jax_compat.emit_buffer_callback(ctx, call, operands)


_send_block_p.def_abstract_eval(_answer_spec)
_send_block_p.def_impl(_call_now)
jax_compat.register_uncached_lowering(_send_block_p, _lower_copied)
if jax_compat.BUFFER_CALLBACKS:
    jax_compat.register_uncached_lowering(_send_block_p, _lower_in_place, platform="cpu")
