"""What jax with x64 off does to a 64-bit array it is given: keeps it as 32 bits. Integers beyond 32 bits would wrap,
and finite floats beyond float32's range would turn into infinities; such arrays are refused rather than changed, as
are arrays of a dtype this jax cannot make arrays of at all (one of ml_dtypes' that its XLA lacks: :func:`held_problem`).

>>> import jax, numpy as np
>>> from jaxstow._read.narrowing import narrowing_problem
>>> narrowing_problem(np.array([1.0, 1e-300, np.inf]))  # rounded, but nothing wrapped or made infinite: None
>>> if not jax.config.jax_enable_x64:  # jax's default
...     print(narrowing_problem(np.array([1.0, -1e39])))
holds float64 values beyond float32's range (down to -1e+39), which jax with x64 off would keep as float32 and turn into infinities; turn x64 on first (jax.config.update('jax_enable_x64', True)) or load with as_numpy=True
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["NARROWED", "held_problem", "narrowing_problem"]

#: The dtypes that jax keeps as 32 bits while its x64 mode is off.
NARROWED = frozenset(np.dtype(name) for name in ("int64", "uint64", "float64", "complex128"))
_ADVICE = "turn x64 on first (jax.config.update('jax_enable_x64', True)) or load with as_numpy=True"


def narrowing_problem(array: np.ndarray) -> str | None:
    """What jax with x64 off would change in ``array``, or ``None``: only its least and greatest values are looked at
    (of the finite ones, where some are not)."""
    if array.dtype not in NARROWED or array.size == 0:
        return None
    narrow = np.dtype(jax.dtypes.canonicalize_dtype(array.dtype))
    if narrow == array.dtype:
        return None
    if array.dtype.kind in "iu":
        beyond = _integers_beyond(array, np.iinfo(narrow))
        return (
            None if beyond is None else f"{beyond}, which jax with x64 off would keep as {narrow} and wrap; {_ADVICE}"
        )
    parts = [array.real, array.imag] if array.dtype.kind == "c" else [array]
    beyond = next((found for part in parts if (found := _floats_beyond(part, array.dtype)) is not None), None)
    if beyond is None:
        return None
    return f"{beyond}, which jax with x64 off would keep as {narrow} and turn into infinities; {_ADVICE}"


@functools.cache
def held_problem(dtype: np.dtype) -> str | None:
    """Why this jax cannot make arrays of ``dtype``, or ``None``: one of ml_dtypes' (of kind ``V``, but for
    float8_e5m2) that this jax's XLA lacks (the float6 dtypes, in jax 0.10), tried once on the default device."""
    if dtype.kind != "V":
        return None
    try:
        jnp.asarray(np.zeros(1, dtype))  # how small arrays are placed; large ones by device_put
        jax.device_put(np.zeros(1, dtype)).block_until_ready()
    except Exception as error:  # XLA's own error, whose type changes with jax's version
        return (
            f"holds {dtype} values, which this jax ({jax.__version__}) cannot make arrays of ({type(error).__name__}): "
            "load with as_numpy=True, or upgrade jax"
        )
    return None


def _integers_beyond(array: np.ndarray, limits: np.iinfo) -> str | None:
    low, high = int(array.min()), int(array.max())
    if limits.min <= low and high <= limits.max:
        return None
    return f"holds {array.dtype} values beyond 32 bits ({f'down to {low}' if low < limits.min else f'up to {high}'})"


def _floats_beyond(part: np.ndarray, dtype: np.dtype) -> str | None:
    largest = float(np.finfo(np.float32).max)
    low, high = float(np.fmin.reduce(part, axis=None)), float(np.fmax.reduce(part, axis=None))  # NaN left out
    if -largest <= low and high <= largest:
        return None
    finite = part[np.isfinite(part)]  # infinities stay infinite: only finite values beyond the range count
    with np.errstate(over="ignore"):  # the overflow looked for
        overflowing = finite[np.isinf(finite.astype(np.float32))]
    if overflowing.size == 0:
        return None
    low, high = float(overflowing.min()), float(overflowing.max())
    return f"holds {dtype} values beyond float32's range ({f'down to {low!r}' if low < 0 else f'up to {high!r}'})"
