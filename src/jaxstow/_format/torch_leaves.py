"""``torch.Tensor`` leaves, stored without pickle, so PyTorch state dicts save through the same core.

torch is never imported here: a tensor can only be met if its owner imported torch, and loading a file with tensors
asks for torch to be imported first (or, where torch is not installed, for the extra that installs it).

A tensor is stored as its values: a conjugate or negative view (``t.conj()`` of a complex tensor) as the values it
shows. Tensors that hold no plain array of values (sparse, nested, quantized, on the meta device) and dtypes that
neither numpy nor ml_dtypes has (``complex32``, packed ``float4``) are refused with the change that makes them
saveable.

>>> import torch
>>> from jaxstow._format.torch_leaves import is_tensor, tensor_from_numpy, tensor_to_numpy
>>> array = tensor_to_numpy(torch.arange(3, dtype=torch.bfloat16))
>>> array.dtype, is_tensor(array)
(dtype(bfloat16), False)
>>> tensor_from_numpy(array)
tensor([0., 1., 2.], dtype=torch.bfloat16)
>>> tensor_to_numpy(torch.tensor([1 + 2j]).conj())
array([1.-2.j], dtype=complex64)
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import ml_dtypes
import numpy as np

from jaxstow._util.optional import require
from jaxstow.errors import RequestError, UnknownNameError, UnsaveableObjectError, excerpt

__all__ = ["is_tensor", "tensor_dtype", "tensor_from_numpy", "tensor_to_numpy"]

# torch dtypes numpy has no name for, viewed through an integer of the same width, by their (shared) names.
_VIA_INTEGER: dict[str, tuple[str, np.dtype]] = {
    name: (integer, np.dtype(getattr(ml_dtypes, name)))
    for name, integer in (
        ("bfloat16", "int16"),
        ("float8_e4m3fn", "uint8"),
        ("float8_e4m3fnuz", "uint8"),
        ("float8_e5m2", "uint8"),
        ("float8_e5m2fnuz", "uint8"),
        ("float8_e8m0fnu", "uint8"),
    )
    if hasattr(ml_dtypes, name)
}
# torch dtypes that numpy has under the same name.
_NUMPY_NAMED = frozenset((
    "bool",
    "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float16", "float32", "float64", "complex64", "complex128",
))  # fmt: skip
_DTYPE_ADVICE = {
    "complex32": "convert it with tensor.to(torch.complex64)",
    "float4_e2m1fn_x2": "save its bytes, tensor.view(torch.uint8), and view them back after loading",
}


def _torch() -> Any:
    return sys.modules.get("torch")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # an import hook that refuses it
        return False


def is_tensor(leaf: object) -> bool:
    """Whether ``leaf`` is a ``torch.Tensor`` (always ``False`` when torch is not imported)."""
    torch = _torch()
    return torch is not None and isinstance(leaf, torch.Tensor)


def _name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def tensor_dtype(tensor: Any) -> np.dtype | None:
    """The numpy dtype of ``tensor``'s elements, or ``None`` for a torch dtype neither numpy nor ml_dtypes has."""
    name = _name(tensor)
    if name in _VIA_INTEGER:
        return _VIA_INTEGER[name][1]
    return np.dtype(name) if name in _NUMPY_NAMED else None


def _unsaveable(tensor: Any) -> str | None:
    """Why ``tensor`` has no array of values to store, and what to save instead; ``None`` when it has one."""
    torch = _torch()
    if tensor.is_meta:
        return "a tensor on the meta device, which holds no values: materialize it (such as with module.to_empty)"
    if tensor.is_nested:
        return "a nested tensor, which is no array: save its tensors, list(tensor.unbind())"
    if tensor.is_quantized:
        return "a quantized tensor: save tensor.dequantize(), or tensor.int_repr() with its scale and zero point"
    if tensor.layout != torch.strided:
        return f"a tensor of layout {tensor.layout}, which stores no plain array: save tensor.to_dense()"
    if tensor_dtype(tensor) is None:
        advice = _DTYPE_ADVICE.get(_name(tensor), "convert it to a dtype numpy or ml_dtypes has")
        return f"a tensor of dtype {tensor.dtype}, which neither numpy nor ml_dtypes has: {advice}"
    return None


def tensor_to_numpy(tensor: Any, *, file: str | None = None, path: str = "") -> np.ndarray:
    """A tensor's values as a numpy array (a view when the tensor is on the CPU, contiguous and no lazy view).

    An :class:`~jaxstow.errors.UnsaveableObjectError` naming ``path`` of ``file`` for a tensor with no array of values
    or of a dtype numpy and ml_dtypes lack.
    """
    problem = _unsaveable(tensor)
    if problem is not None:
        raise UnsaveableObjectError(tensor, file=file, path=path, advice=problem)
    torch = _torch()
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    name = _name(tensor)
    if name in _VIA_INTEGER:
        integer, dtype = _VIA_INTEGER[name]
        return np.asarray(tensor.view(getattr(torch, integer)).numpy().view(dtype))
    return np.asarray(tensor.numpy())


def tensor_from_numpy(array: np.ndarray, *, file: str | None = None, path: str | None = None) -> Any:
    """A tensor of ``array``'s values, sharing its memory where the array is writable and C-contiguous.

    A read-only array (such as a view of a memory-mapped file) is copied: torch has no read-only tensors, and a write
    to one over a read-only mapping would crash the process.
    """
    torch = _torch()
    if torch is None:
        if not _installed("torch"):
            where = f"leaf {excerpt(path)}{f' of {file}' if file else ''}" if path is not None else file or "a leaf"
            require("torch", extra="torch", purpose=f"{where}, a torch.Tensor,")
        raise UnknownNameError("torch.Tensor", file=file, path=path, advice="import torch first")
    name = array.dtype.name
    if name not in _VIA_INTEGER and name not in _NUMPY_NAMED:
        raise RequestError(
            f"torch has no dtype {name} for this torch.Tensor: read it as a numpy array with reader.read(path)",
            file=file,
            path=path,
        )
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = array.copy(order="C")
    if name in _VIA_INTEGER:
        integer, _ = _VIA_INTEGER[name]
        return torch.from_numpy(array.view(integer)).view(getattr(torch, name))
    return torch.from_numpy(array)
