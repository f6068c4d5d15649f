"""A call from a compiled program to a Python function on the host, for blocks of samples: on the CPU it reads the
run's own buffers, from an accelerator the copies XLA made.

:func:`send_block` calls its function, on the CPU in a computation on one device, through an XLA FFI call of
jaxstow's own (a ``ctypes`` handler; jax 0.6.1 on), with numpy views of the operands' buffers, valid during the call only (the
function copies what it keeps); elsewhere (an accelerator, a computation sharded over several devices) through jax's
host callback, pinned to one device. Like ``pure_callback`` it is free of side effects for XLA unless asked for one,
so it costs nothing at the steps of a loop that do not call it; its answer orders the calls. On the CPU it adds no
Python host callback of jax's to the program: with one, even one never called, XLA's CPU runtime hands much of each
step of a loop of many small operations between its threads in most runs (a NUTS run took twice as long), which
neither jax's synchronous dispatch of such programs nor the call itself explains. A function that fails here is
printed, and its answer is zeros: the caller records its own failures.

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

import ctypes
import itertools
import sys
import traceback
import weakref
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
    program holds ``receive`` as long as ``owner`` lives (forever without one); once ``owner`` is gone, its calls do
    nothing and answer zeros.
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
    """The block copied to the host by XLA (any platform)."""
    del owner  # jax keeps the callback with the program
    return jax_compat.emit_host_callback(
        ctx, lambda *arrays: (receive(*arrays),), operands, has_side_effect=side_effect
    )


class _Owner:
    """A weak reference to the owner of a host function, as a parameter of the primitive."""

    def __init__(self, owner: object) -> None:
        self.reference = weakref.ref(owner)


class _Call:
    """A host function called from a compiled program, given numpy views of the buffers of the operands, whose
    shapes and dtypes the program fixed."""

    def __init__(self, receive: Receive, operands: Sequence[Any], answer: Any) -> None:
        self.receive = receive
        self.operands = [_Layout(aval) for aval in operands]
        self.answer = _Layout(answer)

    def __call__(self, frame: _CallFrame) -> None:
        items = frame.args.items
        arrays = [layout.view(items[index].contents.data) for index, layout in enumerate(self.operands)]
        self.answer.view(frame.rets.items[0].contents.data)[...] = self.receive(*arrays)


class _Layout:
    """An array's shape and dtype, and how to view the bytes at an address as one."""

    def __init__(self, aval: Any) -> None:
        self.shape, self.dtype = tuple(aval.shape), np.dtype(aval.dtype)
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.interface = {"shape": (nbytes,), "typestr": "|u1", "version": 3}  # any dtype: ml_dtypes' too
        self.empty = nbytes == 0

    def view(self, address: int | None) -> np.ndarray:
        if self.empty or not address:
            return np.zeros(self.shape, self.dtype)
        raw: np.ndarray = np.asarray(_Memory({**self.interface, "data": (address, False)}))
        array: np.ndarray = raw.view(self.dtype).reshape(self.shape)
        return array


class _Memory:
    """Bytes at an address, as numpy's array interface describes them."""

    def __init__(self, interface: dict[str, Any]) -> None:
        self.__array_interface__ = interface


_calls: dict[int, _Call] = {}  # by the number the program calls it by, each as long as its owner lives
_names = itertools.count()
_TARGET = "jaxstow_send_block"


class _ExtensionBase(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int), ("next", ctypes.c_void_p)]


class _ApiVersion(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("major_version", ctypes.c_int),
        ("minor_version", ctypes.c_int),
    ]


class _Api(ctypes.Structure):  # its first fields
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("api_version", _ApiVersion)]


class _Metadata(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("api_version", _ApiVersion),
        ("traits", ctypes.c_uint32),
        ("state_type_id", ctypes.c_int64),
    ]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _ExtensionBase), ("metadata", ctypes.POINTER(_Metadata))]


class _Buffer(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("rank", ctypes.c_int64),
        ("dims", ctypes.POINTER(ctypes.c_int64)),
    ]


class _Items(ctypes.Structure):  # XLA_FFI_Args and XLA_FFI_Rets
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("size", ctypes.c_int64),
        ("types", ctypes.c_void_p),
        ("items", ctypes.POINTER(ctypes.POINTER(_Buffer))),
    ]


class _Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("value", ctypes.POINTER(ctypes.c_uint64))]


class _Attrs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("size", ctypes.c_int64),
        ("types", ctypes.POINTER(ctypes.c_int)),
        ("names", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(ctypes.POINTER(_Scalar))),
    ]


class _CallFrame(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.POINTER(_ExtensionBase)),
        ("api", ctypes.POINTER(_Api)),
        ("ctx", ctypes.c_void_p),
        ("stage", ctypes.c_int),
        ("args", _Items),
        ("rets", _Items),
        ("attrs", _Attrs),
        ("future", ctypes.c_void_p),
    ]


#: XLA's FFI (``xla/ffi/api/c_api.h``): the metadata extension's type, the execute stage, a scalar attribute's type.
_METADATA, _EXECUTE, _SCALAR = 1, 3, 3


def _handle(address: int) -> None:
    """The FFI handler XLA calls: answers the metadata query, and calls the call its attribute names."""
    frame = _CallFrame.from_address(address)
    if frame.extension_start and frame.extension_start.contents.type == _METADATA:
        extension = ctypes.cast(frame.extension_start, ctypes.POINTER(_MetadataExtension)).contents
        version = frame.api.contents.api_version  # the runtime's own: every handler of that version is compatible
        extension.metadata.contents.api_version = _ApiVersion(
            ctypes.sizeof(_ApiVersion), None, version.major_version, version.minor_version
        )
        extension.metadata.contents.traits = 0
        return
    if frame.stage != _EXECUTE or frame.attrs.size != 1 or frame.attrs.types[0] != _SCALAR:
        return
    call = _calls.get(frame.attrs.attrs[0].contents.value[0])
    if call is not None:
        call(frame)


def _dispatch(address: int) -> None:
    try:
        _handle(address)
    except BaseException:  # nothing may leave a ctypes function: print it, as jax prints a failed callback's
        traceback.print_exc(file=sys.stderr)


_HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(_dispatch)


def _lower_in_place(ctx: Any, *operands: Any, receive: Receive, side_effect: bool, owner: Any) -> Any:
    """On the CPU, in a computation on one device: the block read in place, and the answer written into the
    result's buffer, by XLA's FFI call of :func:`_handle`."""
    if not jax_compat.lowers_for_one_device(ctx):
        return _lower_copied(ctx, *operands, receive=receive, side_effect=side_effect, owner=owner)
    name = next(_names)
    holder = None if owner is None else owner.reference()
    if owner is None or holder is not None:
        _calls[name] = _Call(receive, ctx.avals_in, ctx.avals_out[0])
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
