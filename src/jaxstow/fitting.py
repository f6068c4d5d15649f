"""Fitting a file's leaves into an existing structure (``jaxstow.load(..., like=tree)``), all or nothing.

Every leaf path of ``like`` must be in the file with the same kind, shape and dtype, and the file must hold no leaf
that ``like`` lacks. All problems are collected and raised together, before any data is read.

>>> import io, jax.numpy as jnp, jaxstow
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": jnp.ones((2, 2)), "extra": jnp.ones(1)})
>>> _ = buffer.seek(0)
>>> try:
...     jaxstow.load(buffer, like={"w": jnp.ones(3), "b": jnp.ones(1)})
... except jaxstow.errors.StructureMismatchError as error:
...     print(*error.problems, sep="\\n")
'b': missing from the file (expected float32[1])
'w': the file has float32[2, 2], expected float32[3]
'extra': in the file but not in the structure (float32[1])
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow import registry
from jaxstow.errors import StructureMismatchError
from jaxstow.format.container import Container
from jaxstow.format.leaves import StoredLeaf
from jaxstow.format.torch_leaves import is_tensor, tensor_to_numpy
from jaxstow.restore import read_stored, stored_leaves, to_output
from jaxstow.structure import decode_value
from jaxstow.tree import flatten_with_paths

__all__ = ["fit_into"]

_SCALARS = (bool, int, float, complex, str, bytes)


def _describe(leaf: Any) -> str:
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return f"key<{jax.random.key_impl(leaf)}>{list(leaf.shape)}"
    if isinstance(leaf, jax.Array | np.ndarray | np.generic):
        return f"{leaf.dtype}{list(np.shape(leaf))}"
    if is_tensor(leaf):
        return f"torch {tensor_to_numpy(leaf).dtype}{list(leaf.shape)}"
    if isinstance(leaf, _SCALARS) or leaf is None:
        return f"{type(leaf).__name__} {leaf!r}"
    return registry.name_of(leaf) or repr(leaf)


def _describe_stored(leaf: StoredLeaf) -> str:
    if leaf.kind == "key":
        return f"key<{leaf.impl}>{list(leaf.shape[:-1])}"
    if leaf.kind == "torch":
        return f"torch {leaf.dtype}{list(leaf.shape)}"
    return f"{leaf.dtype}{list(leaf.shape)}"


class _FileLeaves:
    """The file's leaves by path: stored leaves (with their specs) and manifest values (still encoded)."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.values: dict[str, Any] = {}
        if container.manifest is None:
            self.stored = {
                name: StoredLeaf(name, "array", slot.dtype, slot.shape, None, None)
                for name, slot in container.slots.items()
            }
            return
        self.stored = stored_leaves(container)
        for entry in container.manifest["leaves"]:
            if entry["kind"] == "value":
                self.values[entry["path"]] = entry.get("value")

    def paths(self) -> list[str]:
        return [*self.stored, *self.values]

    def describe(self, path: str) -> str:
        if path in self.stored:
            return _describe_stored(self.stored[path])
        return _describe(decode_value(self.values[path], path=path, file=self.container.file))


def _problem(path: str, wanted: Any, file_leaves: _FileLeaves) -> str | None:
    """What is wrong with the file's leaf at ``path`` for a ``like`` leaf ``wanted``; ``None`` if it fits."""
    stored = file_leaves.stored.get(path)
    if isinstance(wanted, jax.Array) and jnp.issubdtype(wanted.dtype, jax.dtypes.prng_key):
        fits = stored is not None and stored.kind == "key" and _describe_stored(stored) == _describe(wanted)
    elif isinstance(wanted, jax.Array | np.ndarray | np.generic):
        fits = (
            stored is not None
            and stored.kind in ("array", "npscalar")
            and stored.dtype == np.dtype(wanted.dtype)
            and stored.shape == tuple(np.shape(wanted))
        )
    elif is_tensor(wanted):
        array = tensor_to_numpy(wanted)
        fits = (
            stored is not None and stored.kind == "torch" and (stored.dtype, stored.shape) == (array.dtype, array.shape)
        )
    elif stored is not None:
        fits = False
    else:
        value = decode_value(file_leaves.values[path], path=path, file=file_leaves.container.file)
        fits = value is wanted or (type(value) is type(wanted) and isinstance(wanted, _SCALARS))
    if fits:
        return None
    return f"{path!r}: the file has {file_leaves.describe(path)}, expected {_describe(wanted)}"


def fit_into(container: Container, like: Any, *, as_numpy: bool) -> Any:
    """``like``'s structure filled with the file's leaves; raises :class:`StructureMismatchError` on any mismatch.

    Arrays come back as numpy where ``like`` has numpy (or with ``as_numpy``), otherwise as jax arrays with the
    sharding of ``like``'s leaf.
    """
    paths, wanted, treedef = flatten_with_paths(like)
    file_leaves = _FileLeaves(container)
    problems = []
    for path, leaf in zip(paths, wanted, strict=True):
        if path not in file_leaves.stored and path not in file_leaves.values:
            problems.append(f"{path!r}: missing from the file (expected {_describe(leaf)})")
        elif (problem := _problem(path, leaf, file_leaves)) is not None:
            problems.append(problem)
    expected = set(paths)
    problems += [
        f"{path!r}: in the file but not in the structure ({file_leaves.describe(path)})"
        for path in file_leaves.paths()
        if path not in expected
    ]
    if problems:
        raise StructureMismatchError(problems, file=container.file)

    data = read_stored(container, [file_leaves.stored[p] for p in paths if p in file_leaves.stored])
    values = [
        data[path] if path in data else decode_value(file_leaves.values[path], path=path, file=container.file)
        for path in paths
    ]
    to_jax = [
        i
        for i, (value, leaf) in enumerate(zip(values, wanted, strict=True))
        if isinstance(value, np.ndarray) and isinstance(leaf, jax.Array) and not as_numpy
    ]
    shardings = [wanted[i].sharding for i in to_jax]
    for i, placed in zip(
        to_jax, to_output([values[i] for i in to_jax], as_numpy=False, shardings=shardings), strict=True
    ):
        values[i] = placed
    return treedef.unflatten(values)
