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

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

try:  # pins the callback to one device of a sharded computation, as pure_callback does; it would run on each
    from jax._src.callback import _callback_op_sharding as _one_device_sharding
except ImportError:  # a jax without it: the callback runs on every device, delivering each block once per device
    _one_device_sharding = None  # type: ignore[assignment]

__all__ = ["send_block"]

#: ``receive(numbers, *leaves)`` on the host, with numpy arrays; answers int32 of shape ``numbers.shape[1:]``.
Receive = Callable[..., np.ndarray]

_send_block_p = Primitive("jaxstow_send_block")


def send_block(receive: Receive, numbers: jax.Array, leaves: Sequence[jax.Array]) -> jax.Array:
    """Call ``receive(numbers, *leaves)`` on the host; returns its answer, int32 of shape ``numbers.shape[1:]``."""
    answer: jax.Array = _send_block_p.bind(numbers, *leaves, receive=receive)  # type: ignore[no-untyped-call]
    return answer


def _answer_spec(numbers: Any, *leaves: Any, receive: Receive) -> jax.core.ShapedArray:
    del leaves, receive
    return jax.core.ShapedArray(numbers.shape[1:], jnp.int32)


def _call_now(numbers: Any, *leaves: Any, receive: Receive) -> jax.Array:
    """Outside jit: call ``receive`` at once."""
    return jnp.asarray(receive(np.asarray(numbers), *(np.asarray(leaf) for leaf in leaves)), jnp.int32)


def _accepts(function: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(function).parameters


def _lower(ctx: Any, *operands: Any, receive: Receive) -> Any:
    sharding = None
    if _one_device_sharding is not None:
        # jax 0.4.x takes (axis_context, sharding), newer releases the result avals too
        arguments = (ctx.module_context.axis_context, None, ctx.avals_out)
        sharding = _one_device_sharding(*arguments[: len(inspect.signature(_one_device_sharding).parameters)])
    # ``returns_token`` appeared after jax 0.4.38, which never returns one
    extra = {"returns_token": False} if _accepts(mlir.emit_python_callback, "returns_token") else {}
    results, _, _ = mlir.emit_python_callback(
        ctx,
        lambda *arrays: (receive(*arrays),),
        None,
        list(operands),
        ctx.avals_in,
        ctx.avals_out,
        has_side_effect=False,
        sharding=sharding,
        **extra,
    )
    return results


_send_block_p.def_abstract_eval(_answer_spec)  # type: ignore[no-untyped-call]
_send_block_p.def_impl(_call_now)  # type: ignore[no-untyped-call]
# ``receive`` differs from call to call: a lowering cached by parameters (jax after 0.4.38) would call a stale one
_uncached: dict[str, Any] = {"cacheable": False} if _accepts(mlir.register_lowering, "cacheable") else {}
mlir.register_lowering(_send_block_p, _lower, **_uncached)
