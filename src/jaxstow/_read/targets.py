"""What a ``like`` leaf asks of the file: a kind, a dtype, a shape, where the array lands, and the casts allowed.

A ``like`` leaf may be a ``jax.Array``, a numpy array or scalar, a ``jax.ShapeDtypeStruct`` (what ``jax.eval_shape``,
``eqx.filter_eval_shape`` and ``nnx.eval_shape`` give, with or without a ``.sharding``), a typed PRNG key, a
``torch.Tensor`` or a plain value: a function or class, which must be the file's; a number or a string, of the
file's type; a ``functools.partial`` or an object saved by its attributes, made of such values.

>>> import jax, jax.numpy as jnp, numpy as np
>>> from jaxstow._read.targets import cast_values, castable, target_of
>>> target_of(jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)).describe()
'bfloat16[2, 3]'
>>> castable(np.dtype(np.float32), np.dtype(jnp.bfloat16)), castable(np.dtype(np.int8), np.dtype(np.int32))
(True, True)
>>> castable(np.dtype(np.float32), np.dtype(np.int32)), castable(np.dtype(np.int64), np.dtype(np.float64))
(False, False)
>>> cast_values(np.array([1e5], np.float32), np.dtype(np.float16), path="w")
Traceback (most recent call last):
jaxstow.errors.RequestError: leaf 'w': cast=True would turn values from 100000.0 to 100000.0 into inf or NaN ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxstow._format.leaves import key_impl_name
from jaxstow._format.shards import Stored
from jaxstow._format.torch_leaves import is_tensor, tensor_dtype
from jaxstow._names import registry
from jaxstow._read.opened import OpenedFile
from jaxstow.errors import RequestError

__all__ = [
    "Target",
    "cast_values",
    "castable",
    "describe_file_leaf",
    "describe_stored",
    "fit_problem",
    "scalar_targets",
    "target_of",
]

Output = Literal["jax", "numpy", "npscalar", "torch", "key", "value", "scalar"]
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


def _native(dtype: Any) -> np.dtype:
    """``dtype`` in this machine's byte order: a file stores big-endian values as their little-endian equal, so a
    ``like`` leaf of ``>f4`` asks for float32.

    >>> _native(np.dtype(">f4")), _native(np.dtype("<i8")), _native(np.dtype("bool"))
    (dtype('float32'), dtype('int64'), dtype('bool'))
    """
    native: np.dtype = np.dtype(dtype)
    return native if native.isnative else native.newbyteorder("=")


def target_of(leaf: Any, *, file: str | None = None, path: str | None = None, placed: bool = False) -> Target:
    """The request a ``like`` leaf makes; a :class:`~jaxstow.errors.RequestError` naming ``path`` of ``file`` for a
    ``torch.Tensor`` of a dtype no stored leaf becomes. ``placed``: ``sharding=`` was given, and places numpy
    leaves on devices as jax arrays too."""
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct) and _is_key_dtype(leaf.dtype):
        return Target("key", shape=tuple(leaf.shape), sharding=_sharding_of(leaf), impl=key_impl_name(leaf.dtype))
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        return Target("jax", _native(leaf.dtype), tuple(leaf.shape), _sharding_of(leaf))
    if isinstance(leaf, np.ndarray):
        return Target("jax" if placed else "numpy", _native(leaf.dtype), leaf.shape)
    if isinstance(leaf, np.generic) and not isinstance(leaf, np.str_ | np.bytes_):  # text: saved as a value
        return Target("jax" if placed else "npscalar", _native(leaf.dtype), ())
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


def cast_values(array: Any, dtype: np.dtype, *, file: str | None = None, path: str | None = None) -> Any:
    """``array`` (numpy or ``jax.Array``) as ``dtype``, refused with a :class:`~jaxstow.errors.RequestError` naming
    ``path`` of ``file`` where a float cast would not keep a value: a finite value outside ``dtype``'s finite range
    (it would become inf or NaN, or be clipped), a negative one for a type without a sign, an inf or a NaN for a type
    without it. Rounding within the range is what a cast does, and allowed.
    """
    source = np.dtype(array.dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # what the cast would lose is refused below, not warned of
        cast = _converted(array, np.dtype(dtype))
    xp: Any = np if isinstance(array, np.ndarray | np.generic) else jnp
    if _kind(source) == "int" and _kind(np.dtype(dtype)) == "int" and not castable(source, np.dtype(dtype)):
        _check_integers_fit(xp.asarray(array), np.dtype(dtype), file=file, path=path)
    if not _may_lose(source, np.dtype(dtype)):
        return cast
    complex_target = _kind(np.dtype(dtype)) == "complex"
    parts = [(array.real, cast.real), (array.imag, cast.imag)] if _kind(source) == "complex" else [(array, cast)]
    wide = np.float64 if _component(source).itemsize > 4 else np.float32
    highest = float(_finfo(_component(np.dtype(dtype))).max)
    for before, after in parts:
        values = xp.asarray(before).astype(wide)
        kept = xp.asarray(after.real if complex_target else after).astype(wide)
        finite = xp.isfinite(values)
        if bool(
            xp.any(finite & (~xp.isfinite(kept) | (xp.sign(kept) * xp.sign(values) < 0) | (xp.abs(values) > highest)))
        ):
            held = values[finite]
            problem = f"values from {float(held.min())!r} to {float(held.max())!r} into inf or NaN or clip them"
        elif bool(xp.any((~finite & ~xp.isnan(values) & (kept != values)) | (xp.isnan(values) & ~xp.isnan(kept)))):
            problem = f"its inf or NaN into other values, which {dtype} has none of"
        else:
            continue
        raise RequestError(
            f"cast=True would turn {problem}: {_range(np.dtype(dtype))}; restore it as {source} or a wider float",
            file=file,
            path=path,
        )
    return cast


def _check_integers_fit(array: Any, dtype: np.dtype, *, file: str | None, path: str | None) -> None:
    """Refuse integers that ``dtype`` (a narrower integer type) would wrap, naming their range and ``dtype``'s."""
    if array.size == 0:
        return
    low, high = int(array.min()), int(array.max())
    info = _iinfo(dtype)
    if low < int(info.min) or high > int(info.max):
        raise RequestError(
            f"cast=True would wrap values from {low} to {high}: {dtype} holds integers from {info.min} to {info.max}; "
            f"restore it as {array.dtype} (with x64 on, for a jax array)",
            file=file,
            path=path,
        )


def _converted(array: Any, dtype: np.dtype) -> Any:
    """``array.astype(dtype)``; through float32 where numpy has no cast between two of ml_dtypes' small floats (or
    ints), such as float8_e4m3fn to float8_e8m0fnu, or uint2 to int4."""
    try:
        return array.astype(dtype)
    except TypeError:
        return array.astype(np.float32).astype(dtype)


def _component(dtype: np.dtype) -> np.dtype:
    """The float type of a complex type's parts; a float type itself."""
    return np.empty(0, dtype).real.dtype


@cache
def _may_lose(source: np.dtype, target: np.dtype) -> bool:
    """Whether a float or complex cast from ``source`` to ``target`` can lose a value, not only precision."""
    if _kind(source) not in ("float", "complex") or _kind(target) not in ("float", "complex"):
        return False
    source, target = _component(source), _component(target)
    if float(_finfo(target).max) < float(_finfo(source).max) or float(_finfo(target).min) > float(_finfo(source).min):
        return True
    probe = np.array([-np.inf, np.inf, np.nan, -1.0], source)
    return not np.array_equal(probe.astype(target).astype(np.float64), probe.astype(np.float64), equal_nan=True)


def _range(dtype: np.dtype) -> str:
    info = _finfo(_component(dtype))
    low, high = float(info.min), float(info.max)
    if low > 0:
        return f"{dtype} holds only positive values, from {low!r} to {high!r}"
    return f"{dtype} holds finite values from {low!r} to {high!r}"


def scalar_targets(
    opened: OpenedFile, paths: list[str], targets: list[Target], wanted: list[Any], *, as_numpy: bool
) -> list[Target]:
    """``targets``, where the file holds a Python scalar and the ``like`` leaf is the weakly typed 0-d array that
    ``jax.eval_shape`` makes of one (of its dtype), a ``"scalar"`` target holding it as that jax scalar (numpy's with
    ``as_numpy``), placed later as the restore's arrays are (``sharding=``, else the ``like`` leaf's sharding)."""
    chosen = []
    for path, target, leaf in zip(paths, targets, wanted, strict=True):
        scalar = _eval_shape_of(opened, path, target, leaf)
        if scalar is not None:
            value = np.asarray(scalar) if as_numpy else scalar
            target = Target("scalar", target.dtype, (), target.sharding, value=value)
        chosen.append(target)
    return chosen


def _eval_shape_of(opened: OpenedFile, path: str, target: Target, leaf: Any) -> jax.Array | None:
    """The file's Python scalar at ``path`` as the jax scalar ``leaf`` stands for, if it is that scalar's shape."""
    if target.output != "jax" or target.shape != () or path in opened.stored or path in opened.per_process:
        return None
    value = opened.value(path) if path in opened else None
    if type(value) not in (bool, int, float, complex):
        return None
    if not getattr(leaf, "weak_type", False) and type(value) is not bool:  # jax has no weakly typed bool
        return None
    scalar = _jax_scalar(value)
    return scalar if scalar is not None and np.dtype(scalar.dtype) == target.dtype else None


def _jax_scalar(value: Any) -> jax.Array | None:
    """The weakly typed scalar jax makes of a Python number; ``None`` where it would not hold it (with x64 off, an int
    beyond int32, or a finite float beyond float32's range, which would become inf).

    >>> _jax_scalar(2**70) is None
    True
    """
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # a float beyond float32: refused below, not warned of
            scalar = jnp.asarray(value)
    except OverflowError:
        return None
    finite = np.isfinite(value) == np.isfinite(np.asarray(scalar))
    return scalar if bool(np.all(finite)) else None


def describe_file_leaf(opened: OpenedFile, path: str) -> str:
    """The file's leaf at ``path`` as messages show it, with where it comes from."""
    if path in opened.stored:
        return describe_stored(opened.stored[path]) + opened.origin(path)
    if path in opened.per_process:
        return "a per-process value"
    return Target("value", value=opened.value(path)).describe()


def fit_problem(opened: OpenedFile, path: str, target: Target, *, cast: bool, as_numpy: bool = False) -> str | None:
    """What keeps the file's leaf at ``path`` from filling ``target``; ``None`` if it fits. A cast is judged into the
    dtype jax keeps of the target's (float32 for float64 with x64 off) where the leaf becomes a jax array."""
    if path not in opened:
        return f"{path!r}: missing from the file (expected {target.describe()})"
    if target.output == "scalar":  # chosen as it fits (scalar_targets)
        return None
    stored = opened.stored.get(path)
    if target.output == "value" and path in opened.per_process:
        return None
    if target.output == "value":
        if stored is None:
            value = opened.value(path)
            wanted = target.value
            if _alike(value, wanted):
                return None
        mismatch = f"{path!r}: the file has {describe_file_leaf(opened, path)}, expected {target.describe()}"
        is_number = type(target.value) in (bool, int, float, complex)
        if stored is not None and is_number and stored.kind in ("array", "npscalar", "sharded"):
            shown = f"jax.ShapeDtypeStruct({stored.shape}, jnp.{stored.dtype})"
            return f"{mismatch}: the file holds an array there; give like an array or {shown} in its place"
        return mismatch
    mismatch = f"{path!r}: the file has {describe_file_leaf(opened, path)}, expected {target.describe()}"
    if stored is None:
        return mismatch + _number_advice(opened, path, target)
    if target.output == "key":
        fits = stored.kind == "key" and stored.impl == target.impl and stored.shape[:-1] == target.shape
        raw = stored.kind != "key" and stored.dtype == np.uint32  # a key's bits, as jax.random.PRNGKey makes them
        advice = "; give like a uint32 array there and make a key of it with jax.random.wrap_key_data" if raw else ""
        return None if fits else mismatch + advice
    if stored.kind == "key":
        return f"{mismatch}; the file holds a typed PRNG key there: give like a key (jax.random.key's) in its place"
    if stored.shape != target.shape:
        return mismatch + (opened.shape_advice(path, target.shape) if target.shape is not None else "")
    assert target.dtype is not None
    if stored.dtype == target.dtype:
        return None
    kept = (
        np.dtype(jax.dtypes.canonicalize_dtype(target.dtype))
        if target.output == "jax" and not as_numpy
        else target.dtype
    )
    if castable(stored.dtype, target.dtype) and castable(stored.dtype, kept):
        return None if cast else f"{mismatch}; pass cast=True to convert it"
    if target.output == "jax" and not as_numpy and _x64_kept(stored.dtype) == target.dtype:
        # x64 off: the int32 jax keeps of an int64, as a restore into jax.ShapeDtypeStruct(..., jnp.int64) gives it
        return None if cast else f"{mismatch}; pass cast=True to convert it (its values are checked to fit)"
    if cast and kept != target.dtype:  # x64 off
        return (
            f"{mismatch}; jax with x64 off keeps {target.dtype} as {kept}, and cast=True does not turn "
            f"{stored.dtype} into {kept}, which would lose values; turn x64 on first "
            "(jax.config.update('jax_enable_x64', True))"
        )
    if cast:
        return f"{mismatch}; cast=True does not turn {stored.dtype} into {target.dtype}, which would lose values"
    return mismatch


def _x64_kept(dtype: np.dtype) -> np.dtype:
    """The dtype jax keeps of ``dtype`` (with x64 off, int32 of int64)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _number_advice(opened: OpenedFile, path: str, target: Target) -> str:
    """What to give ``like`` where the file holds a Python number at ``path`` and ``target`` is an array: the
    number's type, or the weakly typed scalar jax makes of it (``jax.eval_shape``'s), which restores as a jax scalar."""
    value = opened.value(path) if path not in opened.per_process else None
    if type(value) not in (bool, int, float, complex):
        return ""
    name = type(value).__name__
    scalar = ""
    held = _jax_scalar(value) if type(value) is not bool and target.output == "jax" else None
    if held is not None:
        scalar = f", or jax.ShapeDtypeStruct((), jnp.{held.dtype}, weak_type=True) as jax.eval_shape makes"
    elif target.output == "jax" and type(value) is not bool:  # beyond every scalar this jax makes
        x64 = _x64_kept(np.dtype(np.float64)) == np.float64
        turn = "" if x64 else ": turn x64 on (jax.config.update('jax_enable_x64', True)) first"
        scalar = f" (it is beyond the range of the scalars jax makes{turn})"
    return f": the file holds a Python {name} there; give like {'an' if name == 'int' else 'a'} {name} in its place{scalar}"


def _alike(value: Any, wanted: Any, depth: int = 0) -> bool:
    """Whether a value read from the file fills a like's plain value: the same object (a function, a class, an enum
    member), one of the same scalar type or array layout, or a ``functools.partial`` or an object saved by its
    attributes made of such values (each rebuilt by the load, so never the like's own).

    >>> import functools, jax
    >>> _alike(functools.partial(jax.nn.leaky_relu, negative_slope=0.2), functools.partial(jax.nn.leaky_relu, negative_slope=0.1))
    True
    >>> _alike(functools.partial(jax.nn.relu), functools.partial(jax.nn.gelu))
    False
    """
    if value is wanted:
        return True
    if type(value) is not type(wanted) or depth > _MAX_DEPTH:
        return False
    if isinstance(wanted, _SCALARS):
        return True
    if isinstance(wanted, np.ndarray | np.generic):
        return bool(value.shape == wanted.shape and value.dtype == wanted.dtype)
    if isinstance(wanted, list | tuple):
        return len(value) == len(wanted) and all(_alike(a, b, depth + 1) for a, b in zip(value, wanted, strict=True))
    if isinstance(wanted, dict):
        return value.keys() == wanted.keys() and all(_alike(value[key], wanted[key], depth + 1) for key in wanted)
    if isinstance(wanted, functools.partial):
        parts = (value.func, value.args, value.keywords), (wanted.func, wanted.args, wanted.keywords)
        return _alike(*parts, depth + 1)
    if hasattr(wanted, "__dict__") and not callable(wanted):  # an object saved by its attributes
        return _alike(vars(value), vars(wanted), depth + 1)
    return False


#: How deep :func:`_alike` looks into a value (the file's values nest at most as deep).
_MAX_DEPTH = 400
