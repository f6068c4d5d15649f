"""Helpers shared by the saving strategies: sample checks, row writes, block sizes, and chains under ``jax.vmap``.

A saving state may carry leading *chain* dimensions: none for a single chain, one per ``vmap`` around ``save``.
The step functions are written once for any chain shape. :func:`chain_polymorphic` makes ``vmap`` call them with
the mapped axis as one more chain dimension, instead of batching their insides, so that a decision such as "is
any chain's buffer full?" stays a single scalar (``vmap`` cannot batch a ``cond`` that calls the host).

>>> import jax, jax.numpy as jnp
>>> from jaxstow.io.batching import write_rows
>>> buffer = jnp.zeros((2, 3))                       # two chains, three rows each
>>> write_rows(buffer, jnp.array([0, 2]), jnp.array([5.0, 7.0]))
Array([[5., 0., 0.],
       [0., 0., 7.]], dtype=float32)
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.custom_batching import custom_vmap

from jaxstow._format.keypaths import flatten_with_paths
from jaxstow.errors import ArgumentError, CollectorError, excerpt

__all__ = [
    "BLOCKS_PER_RUN",
    "BLOCK_BYTES",
    "STATE_PER_CHAIN",
    "block_rows",
    "chain_polymorphic",
    "conform",
    "keep_flags",
    "row_spec",
    "shared_chains",
    "shared_state_error",
    "spec_of",
    "write_rows",
]

State = TypeVar("State")

#: The kinds of number, each holding the values of those before it.
_KINDS = (jnp.bool_, jnp.integer, jnp.floating, jnp.complexfloating)
#: The ranges of numpy's dtypes and of those of ml_dtypes (int4, float8, ...).
_iinfo: Callable[[np.dtype[Any]], Any] = ml_dtypes.iinfo
_finfo: Callable[[np.dtype[Any]], Any] = ml_dtypes.finfo

#: At most this many bytes of samples in a block: what :func:`jaxstow.io.save` sends to the host per chain in one
#: callback, and the HDF5 collector's chunk. A block that fits in a core's cache leaves the device buffer and lands in
#: the collector fastest.
BLOCK_BYTES = 1 << 20
#: A block holds at most this share of the samples a chain declares, so that the host's work on most of them
#: overlaps the run instead of waiting for its end (at most twice as many callbacks as this, however few samples).
BLOCKS_PER_RUN = 8

#: How to give each chain a saving state of its own, for the errors of a state that chains share.
STATE_PER_CHAIN = (
    "give each chain a saving state of its own: call init_save inside the vmap (not in a jit or scan within it), e.g. "
    "states = jax.vmap(lambda _: init_save(init_sample, init_checkpoint, information))(jnp.arange(chains)), "
    "and map the states along with the samples (in_axes=0); or call it once per chain and stack the states, "
    "jax.tree.map(lambda *s: jnp.stack(s), *[init_save(...) for _ in range(chains)])"
)


def _shape_dtype(shape: tuple[int, ...], dtype: Any) -> Any:
    return jax.ShapeDtypeStruct(shape, dtype)  # type: ignore[no-untyped-call]


def spec_of(tree: Any) -> Any:
    """``tree`` with every leaf replaced by its shape and dtype; a leaf that is no array nor number (a string) is an
    :class:`~jaxstow.errors.ArgumentError` naming it."""

    def spec(path: Any, leaf: Any) -> Any:
        return _shape_dtype(np.shape(leaf), _dtype_of(leaf, f"leaf {jax.tree_util.keystr(path) or 'the root'}"))

    return jax.tree_util.tree_map_with_path(spec, tree)


def bytes_per_sample(spec: Any) -> int:
    """The bytes of one sample of the structure ``spec`` (leaves with a shape and a dtype)."""
    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(spec))


def _dtype_of(leaf: Any, where: str) -> Any:
    """The dtype JAX gives ``leaf``; a leaf of none (a string, an object) is an ArgumentError naming it ``where``."""
    try:
        return jnp.result_type(leaf)
    except TypeError:
        raise ArgumentError(f"{where} is {excerpt(leaf)}: samples and states hold arrays and numbers") from None


def row_spec(buffer: Any, chain_ndim: int) -> Any:
    """The spec of one sample stored in ``buffer``, whose leaves are ``(*chains, rows, *leaf)``."""
    return jax.tree.map(lambda leaf: _shape_dtype(leaf.shape[chain_ndim + 1 :], leaf.dtype), buffer)


def refuse_chain_axes(sample: Any, spec: Any, chains: tuple[int, ...]) -> None:
    """An :class:`~jaxstow.errors.ArgumentError` if a leaf of ``sample`` is ``spec``'s led by the ``chains`` axes of a
    saving state of several chains: ``save`` takes each chain's own sample, as ``jax.vmap`` over the chains gives it."""
    paths, leaves, _ = flatten_with_paths(sample)
    for path, leaf, wanted in zip(paths, leaves, jax.tree.leaves(spec), strict=False):
        if chains and np.shape(leaf) == (*chains, *wanted.shape):
            raise ArgumentError(
                f"sample leaf {path!r} has the shape {list(np.shape(leaf))}, the chains' axes {list(chains)} of the "
                f"saving state before each chain's {list(wanted.shape)}: save takes one chain's sample and state, so "
                "call it under jax.vmap over the chains, jax.vmap(save)(states, keep, samples), as the run that "
                "steps them does"
            )


def conform(value: Any, spec: Any, *, what: str, hint: str = "") -> Any:
    """``value`` checked against ``spec`` (structure and shapes) and cast to its dtypes; ``hint`` says what to do
    when the structure differs.

    Python numbers and weakly typed values take the spec's dtype, if it holds them: of the same kind (bool, integer,
    real, complex) or a wider one, and within its range. The range of a Python number or of a concrete array is
    checked on its values; a traced one (under ``jit``, ``vmap`` or a loop, such as a ``fori_loop`` index) has no
    values yet, so the spec's dtype must hold every value of the array's own dtype, rounding aside: a weak int32 is
    saved into an int32, int64, bfloat16 or float32 leaf but refused from an int16 or float16 one, a weak float32 into a
    float32 or bfloat16 (which only round it) but not a float16 one (which would overflow it). Any other dtype must
    match.

    >>> from jaxstow.io.batching import conform
    >>> int16 = jax.ShapeDtypeStruct((), jnp.int16)
    >>> conform(jnp.asarray(300), int16, what="sample")                    # concrete: its value fits
    Array(300, dtype=int16)
    >>> try:
    ...     jax.jit(lambda i: conform(i + 1, int16, what="sample"))(7)        # traced: any int32 may come
    ... except ArgumentError as error:
    ...     print(error)
    sample leaf '' is a weakly typed int32 ... cannot hold every int32, ... (value.astype(jnp.int16)), ...
    >>> jax.jit(lambda i: conform((i + 1).astype(jnp.int16), int16, what="sample"))(7)
    Array(8, dtype=int16)
    """
    paths, leaves, treedef = flatten_with_paths(value)
    specs, spec_treedef = jax.tree.flatten(spec)
    if treedef != spec_treedef:
        raise ArgumentError(
            f"the {what} has the structure {treedef}, expected {spec_treedef}{'; ' + hint if hint else ''}"
        )
    out = []
    for path, leaf, wanted in zip(paths, leaves, specs, strict=True):
        dtype = _dtype_of(leaf, f"{what} leaf {path!r}")
        weak = isinstance(leaf, bool | int | float | complex) or getattr(leaf, "weak_type", False)
        if np.shape(leaf) != wanted.shape or not (weak or dtype == wanted.dtype):
            fix = (
                f"declare the leaf with the shape {list(np.shape(leaf))}"
                if np.shape(leaf) != wanted.shape
                else f"convert the value yourself (value.astype(jnp.{wanted.dtype})), or declare the leaf as {dtype}"
            )
            raise ArgumentError(
                f"{what} leaf {path!r} is {dtype}{list(np.shape(leaf))}, expected {wanted.dtype}{list(wanted.shape)} "
                f"as init_save was given it: {fix} there (its init_sample, or init_checkpoint for the solver state)"
            )
        if narrowed := _narrowed(leaf, wanted.dtype):
            raise ArgumentError(
                f"{what} leaf {path!r} is {narrowed}, which its dtype {wanted.dtype} cannot hold (JAX keeps numpy's "
                "64-bit arrays in 32 bits unless jax_enable_x64 is on): enable it, "
                "jax.config.update('jax_enable_x64', True), before the run, or convert the value to its dtype yourself"
            )
        if weak and (loss := _cast_loss(leaf, dtype, np.dtype(wanted.dtype))):
            raise ArgumentError(
                f"{what} leaf {path!r} is {loss}, which its dtype {wanted.dtype} cannot hold: declare the leaf with the "
                "dtype of what is saved in it (e.g. init it as 0.0, not 0, for a real number), or convert the value "
                "to its dtype yourself"
            )
        if weak and isinstance(leaf, jax.core.Tracer) and not _holds_all(np.dtype(wanted.dtype), dtype):
            raise ArgumentError(
                f"{what} leaf {path!r} is a weakly typed {dtype} computed under a transformation (jit, vmap, a loop), "
                f"so its value is unknown when it is cast, and its dtype {wanted.dtype} cannot hold every {dtype}, "
                f"which would wrap or overflow: convert the value yourself where you know it fits "
                f"(value.astype(jnp.{wanted.dtype})), or declare the leaf with a dtype that holds it (e.g. init it as "
                f"jnp.{dtype}(0))"
            )
        out.append(jnp.asarray(leaf, wanted.dtype))
    return treedef.unflatten(out)


def _kind(dtype: Any) -> int:
    """0 for bool, 1 for an integer, 2 for a real and 3 for a complex number: a kind holds the values of those before
    it."""
    return next(rank for rank, kind in enumerate(_KINDS) if jnp.issubdtype(dtype, kind))


_WEAK_WIDTHS = {
    np.dtype(wide): np.dtype(narrow)
    for wide, narrow in [("int64", "int32"), ("uint64", "uint32"), ("float64", "float32"), ("complex128", "complex64")]
}


def _holds_all(wanted: np.dtype[Any], dtype: Any) -> bool:
    """Whether ``wanted`` holds every value of ``dtype`` (of a kind it holds), rounding aside: an integer range within
    its own, or no larger than its largest real, and a real's exponents within its own. A 64-bit weak type (x64 on)
    counts as its 32-bit twin: a Python number's default width either way, as with x64 off."""
    dtype = _WEAK_WIDTHS.get(np.dtype(dtype), dtype)
    if _kind(dtype) == 0 or wanted == dtype:
        return True
    if jnp.issubdtype(dtype, jnp.integer):
        source = _iinfo(dtype)
        if jnp.issubdtype(wanted, jnp.integer):
            target = _iinfo(wanted)
            return bool(target.min <= source.min and source.max <= target.max)
        return bool(max(-int(source.min), int(source.max)) <= float(_finfo(wanted).max))
    return bool(_finfo(dtype).maxexp <= _finfo(wanted).maxexp)


def _cast_loss(leaf: Any, dtype: Any, wanted: np.dtype[Any]) -> str:
    """What a weakly typed, concrete ``leaf`` of ``dtype`` is, if ``wanted`` cannot hold it: of a wider kind, or a
    Python number or array with values out of its range; ``""`` if it can."""
    number = isinstance(leaf, bool | int | float | complex)
    what = f"the Python {type(leaf).__name__} {leaf!r}" if number else f"a weakly typed {dtype}"
    if _kind(dtype) > _kind(wanted):
        return what
    if isinstance(leaf, jax.core.Tracer):  # no values to check: conform checked the dtypes
        return ""
    if not number:
        values = np.asarray(leaf)
        return "" if _holds_all(wanted, dtype) else _out_of_range(values, wanted, what)
    if jnp.issubdtype(wanted, jnp.integer):
        info = _iinfo(wanted)
        return "" if info.min <= leaf <= info.max else what
    if jnp.issubdtype(wanted, jnp.inexact):
        most = float(_finfo(wanted).max)
        parts = (complex(leaf).real, complex(leaf).imag)
        return "" if all(abs(part) <= most or not np.isfinite(part) for part in parts) else what
    return ""


def _narrowed(leaf: Any, wanted: Any) -> str:
    """What a numpy array or scalar of a 64-bit dtype that JAX keeps in 32 bits (x64 off) is, if ``wanted`` cannot
    hold one of its values; ``""`` if it can, or if ``leaf`` is no such array."""
    if not isinstance(leaf, np.ndarray | np.generic) or isinstance(leaf, bool | int | float | complex):
        return ""  # a Python number (np.float64 is one) or a jax array: conform checks it otherwise
    if leaf.dtype not in _WEAK_WIDTHS or jnp.result_type(leaf) == leaf.dtype:
        return ""  # not 64 bits, or kept in 64 (x64 on)
    return _out_of_range(np.asarray(leaf), np.dtype(wanted), f"a numpy {leaf.dtype}")


def _out_of_range(values: np.ndarray[Any, Any], wanted: np.dtype[Any], what: str) -> str:
    """``what`` and the first of ``values`` that ``wanted`` cannot hold, out of its range; ``""`` if it holds all."""
    if values.size == 0:
        return ""
    real, imag = np.real(values).astype(np.float64), np.imag(values).astype(np.float64)
    if jnp.issubdtype(wanted, jnp.integer):
        info = _iinfo(wanted)
        out = (real < info.min) | (real > info.max)
    else:
        most = float(_finfo(wanted).max)
        out = np.logical_or(*((np.abs(part) > most) & np.isfinite(part) for part in (real, imag)))
    return f"{what} holding {values[out].flat[0].item()!r}" if out.any() else ""


def block_rows(sample_bytes: int, samples_collected: int | None, most: int) -> int:
    """Rows in a block of samples: the largest power of two of them that fits in :data:`BLOCK_BYTES` and, when the
    chain declares how many samples it keeps, in ``1 / BLOCKS_PER_RUN`` of them; at most ``most``, at least one.

    >>> block_rows(4004, 10_000, 1 << 16), block_rows(4004, 1_250, 1 << 16), block_rows(4, None, 4096)
    (256, 128, 4096)
    """
    fitting = min(most, BLOCK_BYTES // max(1, sample_bytes))
    if samples_collected:
        fitting = min(fitting, samples_collected // BLOCKS_PER_RUN)
    fitting = max(1, fitting)
    return 1 << (fitting.bit_length() - 1)


def keep_flags(keep: Any, chains: tuple[int, ...]) -> jax.Array:
    """``keep`` as one boolean per chain."""
    if keep is None:
        raise ArgumentError("keep is None: pass True to keep the sample, or one boolean per chain")
    if isinstance(keep, (str, bytes)) or jnp.asarray(keep).dtype.kind not in "biu":
        raise ArgumentError(f"keep must be a boolean (or an integer flag) for each chain, got {keep!r}")
    flags = jnp.asarray(keep, jnp.bool_)
    if flags.shape != chains:
        raise ArgumentError(f"keep must be one boolean per chain (shape {chains}), got shape {flags.shape}")
    return flags


def write_rows(buffer: Any, rows: jax.Array, values: Any) -> Any:
    """Write each chain's value into its row of the buffer.

    ``rows`` has the chain shape; each buffer leaf is ``(*chains, rows, *leaf)`` and each value ``(*chains, *leaf)``.
    """
    chains = rows.shape
    if not chains:
        return jax.tree.map(
            lambda stack, value: jax.lax.dynamic_update_index_in_dim(stack, value, rows, 0), buffer, values
        )
    index = (*(jnp.asarray(axis) for axis in np.indices(chains)), rows)
    return jax.tree.map(lambda stack, value: stack.at[index].set(value), buffer, values)


def shared_chains(chain_ids: Iterable[int]) -> dict[int, int]:
    """The chain ids that several chains of a run carry (their saving states are copies of one), and how many do.

    >>> shared_chains([0, 1, 2]), shared_chains([3, 3, 3, 4])
    ({}, {3: 3})
    """
    # Counted in Python: a run's callback asks it for every block, and np.unique costs tens of microseconds there.
    counts = collections.Counter(chain_ids)
    return {chain_id: count for chain_id, count in sorted(counts.items()) if count > 1}


def shared_state_error(shared: dict[int, int], collector: str) -> CollectorError:
    """The error of a run whose chains share saving states (see :func:`shared_chains`)."""
    chains = ", ".join(f"{count} chains write as chain {chain_id}" for chain_id, count in shared.items())
    return CollectorError(
        f"the chains of this run share saving states ({chains}), so their samples would mix in one chain of the "
        f"{collector}, which got none of them; {STATE_PER_CHAIN}"
    )


def chain_polymorphic(step: Callable[..., State], *, state_name: str) -> Callable[..., State]:
    """Wrap ``step(state, *operands) -> state``, written for any chain shape, so that ``vmap`` adds a chain axis.

    Under ``vmap`` the state must be mapped (one saving state per chain); operands that are not mapped are shared by
    all chains.
    """
    wrapped = custom_vmap(step)

    def rule(axis_size: int, in_batched: list[Any], state: State, *operands: Any) -> tuple[State, Any]:
        if not all(jax.tree.leaves(in_batched[0])):
            raise ArgumentError(
                f"under jax.vmap, the {state_name} must be mapped along with the samples, one per chain, or every "
                f"chain would write over the others' samples: {STATE_PER_CHAIN}"
            )

        def broadcast(leaf: Any, mapped: bool) -> Any:
            return leaf if mapped else jnp.broadcast_to(jnp.asarray(leaf), (axis_size, *np.shape(leaf)))

        operands = jax.tree.map(broadcast, operands, tuple(in_batched[1:]))
        # A wrapper of its own, not ``wrapped``: a rule holding that would be a reference cycle, which keeps ``step``
        # (and all it holds) until the garbage collector runs.
        out = chain_polymorphic(step, state_name=state_name)(state, *operands)
        return out, jax.tree.map(lambda _: True, out)

    wrapped.def_vmap(rule)
    return wrapped  # type: ignore[return-value]
