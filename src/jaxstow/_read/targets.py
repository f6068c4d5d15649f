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
>>> castable(np.dtype(np.float32), np.dtype(np.int32))
False
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
from jaxstow._format.torch_leaves import is_tensor, tensor_to_numpy
from jaxstow._names import registry

__all__ = ["Target", "castable", "describe_stored", "target_of"]

Output = Literal["jax", "numpy", "npscalar", "torch", "key", "value"]
_SCALARS = (bool, int, float, complex, str, bytes)
_iinfo: Callable[[np.dtype], Any] = ml_dtypes.iinfo


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


def target_of(leaf: Any) -> Target:
    """The request a ``like`` leaf makes."""
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct) and _is_key_dtype(leaf.dtype):
        return Target("key", shape=tuple(leaf.shape), sharding=_sharding_of(leaf), impl=key_impl_name(leaf.dtype))
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        return Target("jax", np.dtype(leaf.dtype), tuple(leaf.shape), _sharding_of(leaf))
    if isinstance(leaf, np.ndarray):
        return Target("numpy", leaf.dtype, leaf.shape)
    if isinstance(leaf, np.generic):
        return Target("npscalar", leaf.dtype, ())
    if is_tensor(leaf):
        array = tensor_to_numpy(leaf)
        return Target("torch", array.dtype, array.shape)
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

    Between floats (any precision), between complex types, from float to complex, from bool to any number, and from
    integers to integers or floats that hold every value. Anything that loses values between kinds, such as float to
    int, is refused.
    """
    if source == target:
        return True
    source_kind, target_kind = _kind(source), _kind(target)
    if source_kind is None or target_kind is None:
        return False
    if source_kind == "bool" or (source_kind, target_kind) in {("float", "float"), ("complex", "complex")}:
        return True
    if (source_kind, target_kind) == ("float", "complex"):
        return True
    if source_kind == "int" and target_kind == "int":
        low, high = _iinfo(source), _iinfo(target)
        return bool(high.min <= low.min and low.max <= high.max)
    if source_kind == "int" and target_kind in ("float", "complex"):
        return bool(np.can_cast(source, target, "safe")) if source.kind in "iu" and target.kind in "fc" else False
    return False
