"""A call from a compiled program to a Python function on the host, for blocks of samples.

:func:`send_block` calls its function, on the CPU in a computation on one device, through an XLA FFI call of
jaxstow's own (:mod:`jaxstow.io.xla_ffi`, on the jax of ``jax_compat.OWN_FFI_CALLS``) with numpy views of the
operands' buffers, valid during the call only; elsewhere through jax's host callback, pinned to one device, with the
copies XLA made (a program holding one of those runs a loop slower on the CPU: docs/architecture.md). Like
``pure_callback`` it is free of side effects for XLA unless asked for one; its answer orders the calls. A function
that raises fails the run as a failing ``jax.pure_callback`` does.

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
>>> def fail(numbers, *leaves): raise ValueError("no room for this block")
>>> jax.jit(lambda x: send_block(fail, jnp.arange(4), [x]))(jnp.ones(3)).block_until_ready()
Traceback (most recent call last):
...
jax...: ...ValueError: no room for this block...
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow._util import jax_compat
from jaxstow.io import xla_ffi

__all__ = ["send_block"]

#: ``receive(numbers, *leaves)`` on the host, with numpy arrays valid during the call (and ``device=``, the device's
#: place, where each device of a ``shard_map`` or ``pmap`` calls it); answers int32 of shape ``numbers.shape[1:]``.
Receive = Callable[..., np.ndarray]

_send_block_p = jax_compat.new_primitive("jaxstow_send_block")


def send_block(
    receive: Receive,
    numbers: jax.Array,
    leaves: Sequence[jax.Array],
    *,
    side_effect: bool = False,
    owner: object = None,
) -> jax.Array:
    """Call ``receive(numbers, *leaves)`` on the host; returns its answer, int32 of shape ``numbers.shape[1:]``.

    With ``side_effect``, XLA calls it exactly as often as the program asks, never fewer times nor more. A compiled
    program holds ``receive`` as long as ``owner`` lives (forever without one); once ``owner`` is gone, a call of it
    fails the run. An exception of ``receive`` fails the run: waiting for its result raises.
    """
    held = None if owner is None else _Owner(owner)  # the program's parameters must not keep it alive
    answer: jax.Array = _send_block_p.bind(numbers, *leaves, receive=receive, side_effect=side_effect, owner=held)
    return answer


def _answer_spec(numbers: Any, *leaves: Any, **_: Any) -> Any:
    return jax_compat.shaped_array(numbers.shape[1:], jnp.int32)


def _call_now(numbers: Any, *leaves: Any, receive: Receive, **_: Any) -> jax.Array:
    """Outside jit: call ``receive`` at once."""
    return jnp.asarray(receive(np.asarray(numbers), *(np.asarray(leaf) for leaf in leaves)), jnp.int32)


def _lower_copied(ctx: Any, *operands: Any, receive: Receive, side_effect: bool, owner: Any) -> Any:
    """The block copied to the host by XLA (any platform). Where each device calls it (``shard_map``, ``pmap``),
    ``receive`` also gets the device's place among them, ``device=(replica, partition)``."""
    del owner  # jax keeps the callback with the program
    if not jax_compat.lowers_per_device(ctx):
        return jax_compat.emit_host_callback(
            ctx, lambda *arrays: (receive(*arrays),), operands, has_side_effect=side_effect
        )

    def call(replica: np.ndarray, partition: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray]:
        return (receive(*arrays, device=(int(replica), int(partition))),)

    position = jax_compat.shaped_array((), np.uint32)
    return jax_compat.emit_host_callback(
        ctx,
        call,
        [*jax_compat.device_position(), *operands],
        has_side_effect=side_effect,
        operand_avals=[position, position, *ctx.avals_in],
    )


class _Owner:
    """A weak reference to the owner of a host function, as a parameter of the primitive."""

    def __init__(self, owner: object) -> None:
        self.reference = weakref.ref(owner)


class _Layout:
    """An array's shape and dtype, its XLA type, and how to view the bytes at an address as one."""

    def __init__(self, aval: Any) -> None:
        self.code = xla_ffi.dtype_code(aval.dtype)
        self.shape, self.dtype = tuple(aval.shape), np.dtype(aval.dtype) if self.code else None
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * (self.dtype.itemsize if self.dtype else 0)
        self.memory = ctypes.c_ubyte * nbytes  # any dtype: ml_dtypes' too
        self.empty = nbytes == 0

    def view(self, address: int | None) -> np.ndarray:
        if self.empty:
            return np.zeros(self.shape, self.dtype)
        if not address:
            raise xla_ffi.FrameError(f"a buffer of shape {self.shape} has no data")
        array: np.ndarray = np.frombuffer(memoryview(self.memory.from_address(address)), self.dtype).reshape(self.shape)
        return array


class _Call:
    """A host function called from a compiled program, given numpy views of the buffers of the operands, whose
    shapes and dtypes the program fixed (each checked against the call frame's buffer before it is read)."""

    def __init__(self, receive: Receive, operands: Sequence[Any], answer: Any) -> None:
        self.receive = receive
        self.operands = [_Layout(aval) for aval in operands]
        self.answer = _Layout(answer)
        #: The XLA type and shape of each operand's buffer, and of the answer's, as the call frame must hold them.
        self.operand_buffers = [(layout.code or 0, layout.shape) for layout in self.operands]
        self.answer_buffer = [(self.answer.code or 0, self.answer.shape)]

    @property
    def in_place(self) -> bool:
        """Whether XLA's buffers of every operand and the answer can be read as numpy arrays."""
        return all(layout.code is not None for layout in (*self.operands, self.answer))

    def __call__(self, frame: xla_ffi.CallFrame) -> None:
        addresses = xla_ffi.buffer_addresses(frame.args, "args", self.operand_buffers)
        arrays = [layout.view(address) for layout, address in zip(self.operands, addresses, strict=True)]
        (address,) = xla_ffi.buffer_addresses(frame.rets, "rets", self.answer_buffer)
        answer = self.answer
        result = answer.view(address)
        answered = np.asarray(self.receive(*arrays))
        if answered.shape != answer.shape:
            raise ValueError(f"the host function answered shape {answered.shape}, not {answer.shape}")
        result[...] = answered


_calls: dict[int, _Call] = {}  # by the number the program calls it by, each as long as its owner lives
_names = itertools.count()
_TARGET = "jaxstow_send_block"


def _execute(frame: xla_ffi.CallFrame) -> None:
    """Call the call the frame's attribute names."""
    if frame.stage != xla_ffi.EXECUTE:
        raise xla_ffi.FrameError(f"the call is at stage {frame.stage}, not at execution ({xla_ffi.EXECUTE})")
    number = xla_ffi.scalar_attribute(frame, "call")
    call = _calls.get(number)
    if call is None:
        raise xla_ffi.FrameError(
            f"its host function (call {number}) is gone: its owner was freed, or the program was not made by this "
            "process's jaxstow; keep io.save's functions while the run runs"
        )
    call(frame)


def _dispatch(address: int) -> int | None:
    """The FFI handler XLA calls: ``None`` once done, else an ``XLA_FFI_Error`` that fails the run."""
    api = xla_ffi.trusted_api(address)
    try:
        frame = xla_ffi.call_frame(address)
        if xla_ffi.is_metadata_query(frame):  # when the CPU backend registers the handler
            xla_ffi.answer_metadata(frame)
        elif api is None:  # never lowered to (see _lower_in_place), and no error can be made: abort, not answer wrong
            print(f"jaxstow: {_TARGET}: XLA's FFI API is not the one jaxstow reads", file=sys.stderr, flush=True)
            os.abort()
        else:
            _execute(frame)
    except BaseException as failure:  # nothing may leave a ctypes function
        if api is None:  # a metadata query of an API that is not read: jax's callbacks are lowered to
            traceback.print_exc(file=sys.stderr)
            return None
        if isinstance(failure, xla_ffi.FrameError):
            message = f"an unexpected call frame: {failure}"
        else:
            message = f"the host function raised:\n{traceback.format_exc()}"
        return xla_ffi.error(api, f"jaxstow: {_TARGET}: {message}")
    return None


_HANDLER = xla_ffi.HANDLER(_dispatch)


def _lower_in_place(ctx: Any, *operands: Any, receive: Receive, side_effect: bool, owner: Any) -> Any:
    """On the CPU, in a computation on one device: the block read in place, and the answer written into the
    result's buffer, by XLA's FFI call of :func:`_dispatch`; jax's callback where XLA's FFI API was not checked or a
    dtype is not read in place."""
    call = _Call(receive, ctx.avals_in, ctx.avals_out[0])
    if not (jax_compat.lowers_for_one_device(ctx) and xla_ffi.trusted_api_seen() and call.in_place):
        return _lower_copied(ctx, *operands, receive=receive, side_effect=side_effect, owner=owner)
    name = next(_names)
    holder = None if owner is None else owner.reference()
    if owner is None or holder is not None:
        _calls[name] = call
    if holder is not None:
        weakref.finalize(holder, _calls.pop, name, None)
    lower = jax.ffi.ffi_lowering(_TARGET, has_side_effect=side_effect)
    return lower(ctx, *operands, call=np.uint64(name))


_send_block_p.def_abstract_eval(_answer_spec)
_send_block_p.def_impl(_call_now)
jax_compat.register_uncached_lowering(_send_block_p, _lower_copied)
if jax_compat.OWN_FFI_CALLS:
    jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(_HANDLER), platform="cpu")  # type: ignore[no-untyped-call]
    jax_compat.register_uncached_lowering(_send_block_p, _lower_in_place, platform="cpu")
