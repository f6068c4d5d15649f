"""What a ``like`` leaf asks of the file: a kind, a dtype, a shape, where the array lands, and the casts allowed.

A ``like`` leaf may be a ``jax.Array``, a numpy array or scalar, a ``jax.ShapeDtypeStruct`` (what ``jax.eval_shape``,
``eqx.filter_eval_shape`` and ``nnx.eval_shape`` give, with or without a ``.sharding``), a typed PRNG key, a
``torch.Tensor`` or a plain value (a number, a string, a function), which must equal the file's.

>>> import jax, jax.numpy as jnp, numpy as np
>>> from jaxstow._read.targets import castable, target_of
>>> target_of(jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)).describe()
'bfloat16[2, 3]'
>>> castable(np.dtype(np.float32), np.dtype(jnp.bfloat16)), castable(np.dtype(np.int8), np.dtype(np.int32))
(True, True)
>>> castable(np.dtype(np.float32), np.dtype(np.int32)), castable(np.dtype(np.int64), np.dtype(np.float64))
(False, False)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxstow._format.leaves import key_impl_name
from jaxstow._format.shards import Stored
from jaxstow._format.torch_leaves import is_tensor, tensor_dtype
from jaxstow._names import registry
from jaxstow.errors import RequestError

__all__ = ["Target", "castable", "describe_stored", "target_of"]

Output = Literal["jax", "numpy", "npscalar", "torch", "key", "value"]
_SCALARS = (bool, int, float, complex, str, bytes)
_iinfo: Callable[[np.dtype], Any] = ml_dtypes.iinfo
_finfo: Callable[[np.dtype], Any] = ml_dtypes.finfo


@dataclass(frozen=True)
class Target:
    """One ``like`` leaf seen as a request: what it accepts and how the restored leaf is handed back."""

    output: Output
    dtype: np.dtype | None = None
    shape: tuple[int, ...] | None = None
    sharding: Any = None
    impl: str | None = None  # of a PRNG key
    value: Any = None  # of a plain value

    def describe(self) -> str:
        """The leaf as messages show it: ``float32[2, 3]``, ``key<threefry2x32>[]``, ``int 3``."""
        if self.output == "key":
            return f"key<{self.impl}>{list(self.shape or ())}"
        if self.output == "value":
            if isinstance(self.value, _SCALARS) or self.value is None:
                return f"{type(self.value).__name__} {self.value!r}"
            return registry.name_of(self.value) or repr(self.value)
        prefix = "torch " if self.output == "torch" else ""
        return f"{prefix}{self.dtype}{list(self.shape or ())}"


def _is_key_dtype(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jax.dtypes.prng_key))


def target_of(leaf: Any, *, file: str | None = None, path: str | None = None) -> Target:
    """The request a ``like`` leaf makes; a :class:`~jaxstow.errors.RequestError` naming ``path`` of ``file`` for a
    ``torch.Tensor`` of a dtype no stored leaf becomes."""
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct) and _is_key_dtype(leaf.dtype):
        return Target("key", shape=tuple(leaf.shape), sharding=_sharding_of(leaf), impl=key_impl_name(leaf.dtype))
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        return Target("jax", np.dtype(leaf.dtype), tuple(leaf.shape), _sharding_of(leaf))
    if isinstance(leaf, np.ndarray):
        return Target("numpy", leaf.dtype, leaf.shape)
    if isinstance(leaf, np.generic):
        return Target("npscalar", leaf.dtype, ())
    if is_tensor(leaf):
        dtype = tensor_dtype(leaf)
        if dtype is None:
            raise RequestError(
                f"like holds a torch.Tensor of dtype {leaf.dtype}, which neither numpy nor ml_dtypes has, so no stored "
                "leaf restores into it: pass a tensor of another dtype and convert the result",
                file=file,
                path=path,
            )
        return Target("torch", dtype, tuple(leaf.shape))
    return Target("value", value=leaf)


def _sharding_of(leaf: Any) -> Any:
    return getattr(leaf, "sharding", None)


def describe_stored(leaf: Stored) -> str:
    """A stored leaf as messages show it."""
    if leaf.kind == "key":
        return f"key<{leaf.impl}>{list(leaf.shape[:-1])}"
    prefix = "torch " if leaf.kind == "torch" else ""
    return f"{prefix}{leaf.dtype}{list(leaf.shape)}"


def _kind(dtype: np.dtype) -> str | None:
    if dtype == np.bool_:
        return "bool"
    for kind, family in (("complex", jnp.complexfloating), ("float", jnp.floating), ("int", jnp.integer)):
        if jnp.issubdtype(dtype, family):
            return kind
    return None


def castable(source: np.dtype, target: np.dtype) -> bool:
    """Whether ``cast=True`` may turn ``source`` into ``target``.

    Between floats (any precision), between complex types, from float to complex, from bool to any number that holds
    0 and 1, and from integers to integers or floats that hold every value: a float holds the integers up to
    ``2 ** (nmant + 1)``, so int32 casts to float64 but int64 does not (a complex type by its component float).
    Anything that loses values between kinds, such as float to int, is refused.
    """
    if source == target:
        return True
    source_kind, target_kind = _kind(source), _kind(target)
    if source_kind is None or target_kind is None:
        return False
    if (source_kind, target_kind) in {("float", "float"), ("complex", "complex"), ("float", "complex")}:
        return True
    if source_kind in ("bool", "int") and target_kind == "int":
        low, high = _integer_range(source)
        return bool(_iinfo(target).min <= low and high <= _iinfo(target).max)
    if source_kind in ("bool", "int") and target_kind in ("float", "complex"):
        return _holds_integers(target, *_integer_range(source))
    return False


def _integer_range(dtype: np.dtype) -> tuple[int, int]:
    """The lowest and highest value of a bool or integer dtype."""
    if dtype == np.bool_:
        return 0, 1
    return int(_iinfo(dtype).min), int(_iinfo(dtype).max)


def _holds_integers(dtype: np.dtype, low: int, high: int) -> bool:
    """Whether the float or complex ``dtype`` holds every integer from ``low`` to ``high`` exactly."""
    component = np.empty(0, dtype).real.dtype
    info = _finfo(component)
    widest = max(high, -low)
    return bool(float(info.min) <= low and high <= float(info.max) and widest <= 2 ** (int(info.nmant) + 1))
