"""``torch.Tensor`` leaves, stored without pickle, so PyTorch state dicts save through the same core.

torch is never imported here: a tensor can only be met if its owner imported torch, and loading a file with tensors
asks for torch to be imported first (or, where torch is not installed, for the extra that installs it).

>>> import torch
>>> from jaxstow._format.torch_leaves import is_tensor, tensor_from_numpy, tensor_to_numpy
>>> array = tensor_to_numpy(torch.arange(3, dtype=torch.bfloat16))
>>> array.dtype, is_tensor(array)
(dtype(bfloat16), False)
>>> tensor_from_numpy(array)
tensor([0., 1., 2.], dtype=torch.bfloat16)
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import ml_dtypes
import numpy as np

from jaxstow._util.optional import require
from jaxstow.errors import UnknownNameError, excerpt

__all__ = ["is_tensor", "tensor_from_numpy", "tensor_to_numpy"]

# torch dtypes numpy has no name for, viewed through an integer of the same width.
_VIA_INTEGER = {"bfloat16": ("int16", ml_dtypes.bfloat16)}


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


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    """A tensor's data as a numpy array (a view when the tensor is on the CPU and contiguous)."""
    torch = _torch()
    tensor = tensor.detach().cpu().contiguous()
    name = str(tensor.dtype).removeprefix("torch.")
    if name in _VIA_INTEGER:
        integer, dtype = _VIA_INTEGER[name]
        return np.asarray(tensor.view(getattr(torch, integer)).numpy().view(dtype))
    return np.asarray(tensor.numpy())


def tensor_from_numpy(array: np.ndarray, *, file: str | None = None, path: str | None = None) -> Any:
    """A tensor sharing ``array``'s memory."""
    torch = _torch()
    if torch is None:
        if not _installed("torch"):
            where = f"leaf {excerpt(path)}{f' of {file}' if file else ''}" if path is not None else file or "a leaf"
            require("torch", extra="torch", purpose=f"{where}, a torch.Tensor,")
        raise UnknownNameError("torch.Tensor", file=file, path=path, advice="import torch first")
    name = array.dtype.name
    if name in _VIA_INTEGER:
        integer, _ = _VIA_INTEGER[name]
        return torch.from_numpy(array.view(integer)).view(getattr(torch, name))
    return torch.from_numpy(array)
