"""Objax's ``save_var_collection`` / ``load_var_collection``: the variables of Objax modules, by name.

An Objax ``VarCollection`` maps names such as ``'(Linear).w'`` to variables whose ``value`` is an array and whose
``assign`` replaces it; a ``TrainRef`` stands for the variable in its ``ref``. Nothing here imports Objax: anything
shaped like its variables works. See docs/checkpointing.md.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow._format.npz import NpzReader
from jaxstow._save_load import load, save
from jaxstow._storage.folders import make_folder
from jaxstow._storage.opening import PathOrFile, display_name, local_path, open_source
from jaxstow._util.jax_compat import typed_as
from jaxstow.errors import ArgumentError, VariableMismatchError

__all__ = ["load_var_collection", "save_var_collection"]
#: The first bytes of a zip archive (its first member's header), as an archive Objax wrote starts.
_ZIP_START = b"PK\x03\x04"

#: A name of the file -> the name the collection knows it by.
Renamer = Callable[[str], str]


def _target(variable: Any) -> Any:
    """The variable that holds the value: a ``TrainRef``'s ``ref``, any other variable itself."""
    return getattr(variable, "ref", variable)


def _by_variable(collection: Mapping[str, Any]) -> dict[int, tuple[Any, list[str]]]:
    """Each distinct variable of ``collection`` (by identity), with every name it goes by, in order."""
    if not isinstance(collection, Mapping):
        raise ArgumentError(f"vc must be a variable collection (module.vars()), not {type(collection).__name__}")
    variables: dict[int, tuple[Any, list[str]]] = {}
    for name, variable in collection.items():
        target = _target(variable)
        if not (hasattr(target, "value") and callable(getattr(target, "assign", None))):
            raise ArgumentError(
                f"vc[{name!r}] is a {type(target).__name__}, not a variable (with .value and .assign): pass "
                "module.vars(), whose values are Objax variables"
            )
        variables.setdefault(id(target), (target, []))[1].append(name)
    return variables


def save_var_collection(
    file: PathOrFile, vc: Mapping[str, Any], *, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Save the values of the variables of ``vc``, each once, under the first name it goes by, as Objax does.

    The file is a jaxstow file of ``{name: value}``, written atomically when given a file name (its folders made if
    missing, as Objax does), at the current position of a file object, cut where the save ends (what followed, an
    earlier content, is gone). See :func:`load_var_collection` for an example.

    Args:
        file: A path, an fsspec URL or a binary file object.
        vc: The variable collection, ``module.vars()``.
        storage_options: Passed to fsspec for a URL ``file``.

    Raises:
        ArgumentError: A name that is no str or a value that is no array, which :func:`load_var_collection` could not
            read back; nothing is written.
    """
    tree = {names[0]: variable.value for variable, names in _by_variable(vc).values()}
    unnamed, others = _unloadable(tree)
    if unnamed or others:  # a file load_var_collection would refuse
        found = [f"the name {name!r}" for name in unnamed] + [
            f"{name!r} holding {type(tree[name]).__name__}" for name in others
        ]
        raise ArgumentError(
            f"{display_name(file)}: save_var_collection saves arrays under str names, which load_var_collection "
            f"reads back; vc has {', '.join(found)}: pass module.vars(), or save other trees with jaxstow.save"
        )
    local = local_path(file) if isinstance(file, str | os.PathLike) else None
    if local is not None and os.path.dirname(local):  # its folders made first, as Objax does
        make_folder(os.path.dirname(local))
    save(file, tree, storage_options=storage_options)


def load_var_collection(
    file: PathOrFile,
    vc: Mapping[str, Any],
    renamer: Renamer | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Assign every variable of ``vc`` its value from ``file`` (jaxstow's or Objax's ``.npz``), all or nothing.

    Args:
        file: A path, an fsspec URL or a binary file object.
        vc: The variable collection, ``module.vars()``; each variable takes the value stored under one of its names.
        renamer: Maps the file's names to ``vc``'s.
        storage_options: Passed to fsspec for a URL ``file``.

    Raises:
        VariableMismatchError: Variables with no stored value, or of another shape or dtype, or tied here but
            stored apart with different values, all listed (also a ``ValueError`` and, as Objax raises, an
            ``AssertionError``).

    >>> import io, jax.numpy as jnp
    >>> from jaxstow.objax import load_var_collection, save_var_collection
    >>> class Var:                                       # an Objax variable, as far as this goes
    ...     def __init__(self, value): self.value = value
    ...     def assign(self, value, check=True): self.value = value
    >>> buffer = io.BytesIO()
    >>> save_var_collection(buffer, {"(Linear).w": Var(jnp.ones(2)), "(Linear).b": Var(jnp.zeros(1))})
    >>> _ = buffer.seek(0)
    >>> fresh = {"(Linear).w": Var(jnp.zeros(2)), "(Linear).b": Var(jnp.ones(1))}
    >>> load_var_collection(buffer, fresh)
    >>> fresh["(Linear).w"].value
    Array([1., 1.], dtype=float32)
    """
    stored = _read_objax_archive(file)
    if stored is None:
        stored = load(file, as_numpy=True, storage_options=storage_options)  # typed PRNG keys come back as jax arrays
        if not isinstance(stored, dict):
            raise VariableMismatchError(
                ["the file holds no variable collection (a flat dict of arrays)"], file=display_name(file)
            )
        unnamed, others = _unloadable(stored)
        if unnamed:
            raise VariableMismatchError(
                [f"{name!r}: a key of the file's dict that is no variable name (a str)" for name in unnamed],
                file=display_name(file),
            )
        if others:
            raise VariableMismatchError(
                [f"{name!r}: stored {type(stored[name]).__name__}, not an array" for name in others],
                file=display_name(file),
            )
    if renamer is not None and not callable(renamer):
        raise ArgumentError(f"renamer must be a function of a name (objax.io.Renamer), not {type(renamer).__name__}")
    rename = renamer or (lambda name: name)
    values: dict[str, Any] = {}
    for stored_name, value in stored.items():
        renamed = rename(stored_name)
        if not isinstance(renamed, str):
            raise ArgumentError(f"renamer({stored_name!r}) returned {renamed!r}, not a name (a str)")
        if renamed in values:
            raise VariableMismatchError(
                [
                    f"{renamed!r}: two stored variables are renamed to it (the second is {stored_name!r}); give the renamer "
                    "a rule that keeps them apart"
                ],
                file=display_name(file),
            )
        values[renamed] = value
    assignments, problems = [], []
    for variable, names in _by_variable(vc).values():
        stored_names = [name for name in names if name in values]
        if not stored_names:
            problems.append(f"{' = '.join(map(repr, names))}: no stored value")
            continue
        name = stored_names[0]
        problems += [
            _untied(names, name, other) for other in stored_names[1:] if not _same(values[name], values[other])
        ]
        value, expected = values[name], getattr(variable, "value", None)
        if expected is None or not (hasattr(expected, "shape") and hasattr(expected, "dtype")):
            problems.append(f"{name!r}: the variable holds {type(expected).__name__}, not an array, to load into")
        elif value.shape != expected.shape or value.dtype != _native(expected.dtype):
            problems.append(f"{name!r}: stored {_describe(value)}, the variable holds {_describe(expected)}")
        assignments.append((variable, value))
    if problems:
        unused = sorted(set(values) - {name for _, names in _by_variable(vc).values() for name in names})
        if unused:
            problems.append(f"stored but not in the collection (renamed?): {', '.join(map(repr, unused))}")
        raise VariableMismatchError(problems, file=display_name(file))
    _assign_all(assignments, file=display_name(file))


def _assign_all(assignments: list[tuple[Any, Any]], *, file: str) -> None:
    """Assign each variable its value, as it holds it (jax would narrow a numpy variable's 64 bits; a weakly typed
    one, ``jnp.asarray(2.0)``, stays weakly typed, and promotes as a Python number does); where one's
    ``assign`` fails, those assigned before it get their values back, and the failure is an ``ArgumentError``."""
    done: list[tuple[Any, Any]] = []
    try:
        for variable, value in assignments:
            held = variable.value
            on_host = isinstance(held, np.ndarray | np.generic)
            _assign(variable, np.array(value) if on_host else typed_as(jnp.asarray(value), held))  # weak as held
            done.append((variable, held))
    except Exception as error:
        for variable, held in reversed(done):
            _assign(variable, held)
        raise ArgumentError(
            f"a variable's assign() failed ({type(error).__name__}: {error}) loading {file}: no variable was changed"
        ) from error


def _assign(variable: Any, value: Any) -> None:
    """``variable.assign(value)``, unchecked where it takes Objax's ``check=`` (checked here already, and Objax's
    check refuses a numpy value); a variable of another library's, shaped like Objax's, may not take it."""
    try:
        parameters = list(inspect.signature(variable.assign).parameters.values())
    except (TypeError, ValueError):  # a builtin's: no signature to read
        parameters = []
    if any(parameter.name == "check" or parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        variable.assign(value, check=False)
    else:
        variable.assign(value)


def _unloadable(tree: dict[Any, Any]) -> tuple[list[Any], list[Any]]:
    """The names of ``tree`` that are no str, and those whose values are no arrays: no variable collection's."""
    unnamed = [name for name in tree if not isinstance(name, str)]
    others = [name for name, value in tree.items() if not isinstance(value, np.ndarray | np.generic | jax.Array)]
    return unnamed, others


def _same(first: Any, second: Any) -> bool:
    """Whether two stored values are the same array, bit for bit (a typed PRNG key by its key data)."""
    if first.dtype != second.dtype or first.shape != second.shape:
        return False
    if jnp.issubdtype(first.dtype, jax.dtypes.prng_key):
        first, second = jax.random.key_data(first), jax.random.key_data(second)
    return bool(np.asarray(first).tobytes() == np.asarray(second).tobytes())


def _untied(names: list[str], kept: str, other: str) -> str:
    """The problem of a variable that goes by ``names`` here (tied) and whose names ``kept`` and ``other`` hold
    different values in the file (saved where they were two variables)."""
    return (
        f"{' = '.join(map(repr, names))}: one variable here (tied weights), but the file holds different values under "
        f"{kept!r} and {other!r} (saved where they were two): load it into the model it was saved from, or choose "
        f"one with renamer=lambda name: 'unused/' + name if name == {other!r} else name"
    )


def _describe(array: Any) -> str:
    return f"{array.dtype}{list(array.shape)}"


def _read_objax_archive(file: PathOrFile) -> dict[str, np.ndarray] | None:
    """The variables of a file in Objax's own layout, or ``None`` for any other file (a file object is left where
    it was)."""
    if isinstance(file, str | os.PathLike) and local_path(file) is None:
        return None  # a URL: Objax wrote local files only
    with _kept_position(file) as readable:
        if not _starts_as_zip(readable):
            return None
    with _kept_position(file) as readable:  # every size, count and CRC checked before anything is allocated
        reader = NpzReader(open_source(readable), text_members=frozenset({"names"}))
        try:
            if "names" not in reader.slots or reader.manifest is not None:
                return None  # numpy's or jaxstow's own npz, read as such
            names = reader.read(["names"])["names"]
            expected = {"names", *(str(index) for index in range(len(names)))}
            if names.ndim != 1 or names.dtype.kind != "U" or set(reader.slots) != expected:
                raise VariableMismatchError(
                    ["an Objax archive holds `names` (text) and one array per name, `0` to `len(names) - 1`"],
                    file=display_name(file),
                )
            twice = sorted(name for name, count in collections.Counter(map(str, names)).items() if count > 1)
            if twice:
                raise VariableMismatchError(
                    [f"{name!r}: named twice in the archive's `names`" for name in twice], file=display_name(file)
                )
            return {str(name): reader.read([str(index)])[str(index)] for index, name in enumerate(names)}
        finally:
            reader.close()


def _starts_as_zip(readable: str | BinaryIO) -> bool:
    """Whether a file (a path, or a file object from where it is) starts as a zip archive: a tensor's bytes near the
    end of another file may look like the end of one. A path that cannot be read is left to the load to name."""
    if not isinstance(readable, str):
        return readable.read(len(_ZIP_START)) == _ZIP_START
    try:
        with open(readable, "rb") as opened:
            return opened.read(len(_ZIP_START)) == _ZIP_START
    except OSError:
        return False


@contextlib.contextmanager
def _kept_position(file: PathOrFile) -> Iterator[str | BinaryIO]:
    """``file`` to read: a path as a string, a file object as it is, put back where it was afterwards."""
    if isinstance(file, str | os.PathLike):
        yield os.fspath(file)
        return
    try:
        start = file.tell() if not getattr(file, "closed", False) and file.seekable() else None
    except (OSError, AttributeError, ValueError):  # a pipe, a socket: io.UnsupportedOperation is an OSError
        start = None
    if start is None:
        raise ArgumentError(
            f"{display_name(file)}: a file object to read must be open and seekable: read it whole into "
            "io.BytesIO(...) first"
        )
    try:
        yield file
    finally:
        file.seek(start)


def _native(dtype: Any) -> Any:
    """A numpy dtype in this machine's byte order (a file holds big-endian values as their little-endian equal);
    another dtype (a PRNG key's) as it is."""
    return dtype.newbyteorder("=") if isinstance(dtype, np.dtype) else dtype
