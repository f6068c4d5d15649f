"""XLA's FFI C API, as far as a handler of :mod:`jaxstow.io.host_block` reads it, mirrored in ``ctypes``.

The layouts follow ``xla/ffi/api/c_api.h`` of API major version 0 (checked against the header of each jaxlib that
``jax_compat.OWN_FFI_CALLS`` admits). Nothing is read before its size is checked: every struct carries its
``struct_size``, and a struct smaller than the fields read, an API of another major version, or a buffer that is not
the one the program fixed raises :class:`FrameError`, which the handler answers XLA with as an error of the run.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "HANDLER",
    "Api",
    "CallFrame",
    "FrameError",
    "answer_metadata",
    "buffer_addresses",
    "call_frame",
    "dtype_code",
    "error",
    "is_metadata_query",
    "scalar_attribute",
    "trusted_api",
    "trusted_api_seen",
]

#: The metadata extension's type, the execute stage, a buffer's argument type, a scalar attribute's type, uint64.
METADATA, EXECUTE, BUFFER, SCALAR, U64 = 1, 3, 1, 3, 9
#: ``XLA_FFI_Error_Code`` INTERNAL, of every failure: jax raises it as the RuntimeError of a failed callback.
INTERNAL = 13

#: ``XLA_FFI_DataType`` of the dtypes whose buffers hold one whole item per element (``xla_data.proto``'s
#: ``PrimitiveType``); sub-byte types, which XLA may pack, are left to jax's callbacks.
_DTYPE_CODES = {
    "bool": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,
    "uint16": 7,
    "uint32": 8,
    "uint64": 9,
    "float16": 10,
    "float32": 11,
    "float64": 12,
    "complex64": 15,
    "bfloat16": 16,
    "complex128": 18,
    "float8_e5m2": 19,
    "float8_e4m3fn": 20,
    "float8_e4m3b11fnuz": 23,
    "float8_e5m2fnuz": 24,
    "float8_e4m3fnuz": 25,
    "float8_e4m3": 28,
    "float8_e3m4": 29,
    "float8_e8m0fnu": 33,
}


class FrameError(Exception):
    """A call frame, or a struct it points to, that does not hold what the handler reads."""


class _Extension(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int), ("next", ctypes.c_void_p)]


class _ApiVersion(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("major_version", ctypes.c_int),
        ("minor_version", ctypes.c_int),
    ]


class _ErrorCreateArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("message", ctypes.c_char_p),
        ("errc", ctypes.c_int),
    ]


class Api(ctypes.Structure):
    """``XLA_FFI_Api``, up to its first function."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("api_version", _ApiVersion),
        ("internal_api", ctypes.c_void_p),
        ("error_create", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ErrorCreateArgs))),
    ]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _ApiVersion), ("traits", ctypes.c_uint32)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _Extension), ("metadata", ctypes.POINTER(_Metadata))]


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
        ("types", ctypes.POINTER(ctypes.c_int)),
        ("items", ctypes.POINTER(ctypes.POINTER(_Buffer))),
    ]


class _ByteSpan(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("value", ctypes.POINTER(ctypes.c_uint64))]


class _Attrs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("size", ctypes.c_int64),
        ("types", ctypes.POINTER(ctypes.c_int)),
        ("names", ctypes.POINTER(ctypes.POINTER(_ByteSpan))),
        ("attrs", ctypes.POINTER(ctypes.POINTER(_Scalar))),
    ]


class CallFrame(ctypes.Structure):
    """``XLA_FFI_CallFrame``, up to its attributes (its ``future`` is never read)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.POINTER(_Extension)),
        ("api", ctypes.POINTER(Api)),
        ("ctx", ctypes.c_void_p),
        ("stage", ctypes.c_int),
        ("args", _Items),
        ("rets", _Items),
        ("attrs", _Attrs),
    ]


def _check_size(struct: Any, last_field: str, what: str) -> None:
    """Raise unless ``struct`` (its own ``struct_size``) holds the fields up to ``last_field``."""
    field = getattr(type(struct), last_field)
    if struct.struct_size < field.offset + field.size:
        raise FrameError(f"{what} has {struct.struct_size} bytes, fewer than the {field.offset + field.size} read")


#: The addresses of the APIs checked so far: XLA's is one static struct per process.
_trusted: set[int] = set()


def trusted_api(address: int) -> Api | None:
    """The API of the call frame at ``address``, if it is one of major version 0 that holds ``XLA_FFI_Error_Create``:
    the only field read without a check is the frame's ``struct_size``."""
    frame = CallFrame.from_address(address)
    if frame.struct_size < CallFrame.api.offset + CallFrame.api.size or not frame.api:
        return None
    api_address = ctypes.addressof(frame.api.contents)
    api: Api = frame.api.contents
    if api_address not in _trusted:
        try:
            _check_size(api, "error_create", "XLA_FFI_Api")
            _check_size(api.api_version, "minor_version", "XLA_FFI_Api_Version")
        except FrameError:
            return None
        if api.api_version.major_version != 0 or not api.error_create:
            return None
        _trusted.add(api_address)
    return api


def call_frame(address: int) -> CallFrame:
    """The call frame at ``address``, checked to hold every field read."""
    frame = CallFrame.from_address(address)
    _check_size(frame, "attrs", "XLA_FFI_CallFrame")
    return frame


def is_metadata_query(frame: CallFrame) -> bool:
    """Whether XLA asks the handler for its metadata (when the CPU backend registers it), not to run."""
    if not frame.extension_start:
        return False
    extension = frame.extension_start.contents
    _check_size(extension, "type", "XLA_FFI_InternalExtension")
    return bool(extension.type == METADATA)


def answer_metadata(frame: CallFrame) -> None:
    """Fill the metadata extension: the handler has the API's own version, and no traits."""
    metadata = ctypes.cast(frame.extension_start, ctypes.POINTER(_MetadataExtension)).contents
    needed = _MetadataExtension.metadata.offset + _MetadataExtension.metadata.size
    if metadata.extension_base.struct_size < needed or not metadata.metadata or not frame.api:
        raise FrameError(f"XLA_FFI_Metadata_Extension has {metadata.extension_base.struct_size} bytes, not {needed}")
    _check_size(metadata.metadata.contents, "traits", "XLA_FFI_Metadata")
    _check_size(frame.api.contents, "api_version", "XLA_FFI_Api")
    version = frame.api.contents.api_version
    _check_size(version, "minor_version", "XLA_FFI_Api_Version")
    metadata.metadata.contents.api_version = _ApiVersion(
        ctypes.sizeof(_ApiVersion), None, version.major_version, version.minor_version
    )
    metadata.metadata.contents.traits = 0


def scalar_attribute(frame: CallFrame, name: str) -> int:
    """The frame's one attribute, a uint64 scalar called ``name``."""
    attrs = frame.attrs
    _check_size(attrs, "attrs", "XLA_FFI_Attrs")
    if attrs.size != 1 or attrs.types[0] != SCALAR:
        raise FrameError(f"the call has {attrs.size} attributes, not the one scalar {name!r}")
    span = attrs.names[0].contents
    if ctypes.string_at(span.ptr, span.len) != name.encode():
        raise FrameError(f"the call's attribute is {ctypes.string_at(span.ptr, span.len)!r}, not {name!r}")
    scalar = attrs.attrs[0].contents
    if scalar.dtype != U64:
        raise FrameError(f"the attribute {name!r} has XLA type {scalar.dtype}, not uint64 ({U64})")
    return int(scalar.value[0])


def dtype_code(dtype: Any) -> int | None:
    """The ``XLA_FFI_DataType`` of ``dtype`` if its buffers are read in place (else None)."""
    try:
        return _DTYPE_CODES.get(np.dtype(dtype).name)
    except TypeError:  # jax's extended dtypes (PRNG keys)
        return None


def buffer_addresses(items: _Items, what: str, wanted: Sequence[tuple[int, tuple[int, ...]]]) -> list[int | None]:
    """The address of each buffer of the arguments or results ``items`` (read once per call), checked to be as many
    as ``wanted`` and to hold its XLA type and shape."""
    _check_size(items, "items", f"XLA_FFI_{what.capitalize()}")
    if items.size != len(wanted):
        raise FrameError(f"the call has {items.size} {what}, not {len(wanted)}")
    types, buffers = items.types, items.items
    addresses: list[int | None] = []
    for index, (code, shape) in enumerate(wanted):
        if types[index] != BUFFER:
            raise FrameError(f"{what} {index} is of kind {types[index]}, not a buffer")
        buffer = buffers[index].contents
        _check_size(buffer, "dims", "XLA_FFI_Buffer")
        rank = buffer.rank
        dims = tuple(buffer.dims[:rank]) if 0 <= rank <= len(shape) else None
        if buffer.dtype != code or dims != shape:
            raise FrameError(
                f"{what} {index} is a buffer of XLA type {buffer.dtype} and rank {rank} (dims {dims}), "
                f"not of type {code} and shape {shape}"
            )
        addresses.append(buffer.data)
    return addresses


def error(api: Api, message: str) -> int:
    """A new ``XLA_FFI_Error`` of ``message`` (owned by XLA once the handler returns it)."""
    args = _ErrorCreateArgs(ctypes.sizeof(_ErrorCreateArgs), None, message.encode("utf-8", "replace"), INTERNAL)
    address: int = api.error_create(ctypes.byref(args))
    return address


#: The C type of an FFI handler: ``XLA_FFI_Error* handler(XLA_FFI_CallFrame*)``.
HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


def trusted_api_seen() -> bool:
    """Whether XLA has shown a handler an API it reads (at the CPU backend's metadata query of each handler)."""
    return bool(_trusted)
