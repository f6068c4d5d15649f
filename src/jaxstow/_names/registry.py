"""Names for objects that are not data: functions, classes, sentinels.

A file never stores code: it stores a *name*, which loading looks up here, in this order: the objects registered
with :func:`saveable`; the public namespaces of the known libraries and the objects some of them define in their own
modules (:mod:`jaxstow._names.libraries`); for pytree node types only, ``module.qualname`` of a class in an imported
module. Library objects pass :mod:`jaxstow._names.policy` first, and loading never imports a module. A registered
class that is not a pytree is saved by its attributes (:func:`attribute_class_name`). See docs/safety.md.

>>> import jax
>>> from jaxstow._names import registry
>>> registry.name_of(jax.nn.relu), registry.lookup("jax.nn.relu") is jax.nn.relu
('jax.nn.relu', True)
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import sys
import threading
import types
import warnings
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar, overload

from jaxstow._names.advice import import_advice
from jaxstow._names.libraries import Libraries, known
from jaxstow._names.policy import FORBIDDEN_MODULES, describe_policy, module_of, name_refusal, refusal
from jaxstow.errors import ArgumentError, RefusedNameError, UnknownNameError

__all__ = ["attribute_class_name", "lookup", "name_of", "saveable"]

T = TypeVar("T")

_BUILTINS: dict[str, object] = {
    "builtins.dict": dict,
    "builtins.list": list,
    "builtins.tuple": tuple,
    "builtins.NoneType": type(None),
    "collections.OrderedDict": collections.OrderedDict,
    "collections.defaultdict": collections.defaultdict,
}

_registered: dict[str, object] = {}
_registered_names: dict[int, str] = {}
_registering = threading.Lock()  # a name and its object change together


@dataclasses.dataclass(frozen=True)
class _Tables:
    """The names of the ``libraries``' objects, as indexed when ``sys.modules`` held ``modules`` modules.

    ``pending`` were still being imported (by another thread) and had not defined all their names yet.
    """

    modules: int
    pending: tuple[types.ModuleType, ...]
    by_name: dict[str, object]
    by_id: dict[int, str]
    refused: dict[str, str]  # names the name policy refuses, and why
    refused_ids: dict[int, str]  # the objects of those names, by id, and why
    libraries: Libraries = dataclasses.field(default_factory=known)

    def current(self) -> bool:
        """Whether no module has been imported since, nor finished being imported, nor a library registered."""
        return (
            self.modules == len(sys.modules) and self.libraries is known() and not any(map(_initialising, self.pending))
        )


class _LibraryIndex:
    """Names of the known libraries' objects, rebuilt whenever more modules have been imported.

    Threads share it: the tables are rebuilt by one thread at a time, and published whole, with the module count
    they were built for, so a thread sees either the old tables or the new ones, never new tables half built.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables = _Tables(-1, (), {}, {}, {}, {})

    def tables(self) -> _Tables:
        """The tables, rebuilt first if modules have been imported since they were built."""
        tables = self._tables
        if tables.current():
            return tables
        with self._lock:
            if not self._tables.current():
                self._tables = self._build()
            return self._tables

    def _build(self) -> _Tables:
        # The count and the libraries are taken first: a module imported, or a library registered, while the index
        # is built makes the next call build it again.
        modules = len(sys.modules)
        libraries = known()
        by_name: dict[str, object] = dict(_BUILTINS)
        by_id: dict[int, str] = {id(obj): name for name, obj in _BUILTINS.items()}
        refused: dict[str, str] = {}
        refused_ids: dict[int, str] = {}
        indexed = []
        names, searched = frozenset(libraries.names), libraries.searched_inside
        for module_name in libraries.public_namespaces:
            module = sys.modules.get(module_name)
            if module is not None:
                indexed.append(module)
                self._index(
                    module_name, module, by_name, by_id, (refused, refused_ids), libraries=names, defined_in=None
                )
        for module_name, module in sorted(dict(sys.modules).items()):
            if module_name.partition(".")[0] in searched and isinstance(module, types.ModuleType):
                indexed.append(module)
                self._index(
                    module_name, module, by_name, by_id, (refused, refused_ids), libraries=names, defined_in=searched
                )
        pending = tuple(module for module in indexed if _initialising(module))
        return _Tables(modules, pending, by_name, by_id, refused, refused_ids, libraries)

    @staticmethod
    def _index(
        module_name: str,
        module: types.ModuleType,
        by_name: dict[str, object],
        by_id: dict[int, str],
        refused: tuple[dict[str, str], dict[int, str]],
        *,
        libraries: Collection[str],
        defined_in: Collection[str] | None,
    ) -> None:
        """Index ``module``'s public attributes (``defined_in=None``), or those defined in a module of ``defined_in``.

        An object that is no function or class is nameable when its type is of ``libraries``.
        """
        public_only = defined_in is None
        for attribute, obj in list(vars(module).items()):
            if attribute.startswith("__") or (public_only and attribute.startswith("_")):
                continue
            if not _is_nameable(obj, libraries) or (defined_in is not None and not _defined_in(obj, defined_in)):
                continue
            name = f"{module_name}.{attribute}"
            reason = refusal(name, obj)
            if reason is not None:
                refused[0].setdefault(name, reason)
                refused[1].setdefault(id(obj), reason)
                continue
            by_name.setdefault(name, obj)
            by_id.setdefault(id(obj), name)


def _initialising(module: types.ModuleType) -> bool:
    """Whether ``module`` is still being executed by an import (it is in ``sys.modules`` from the start)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _is_nameable(obj: object, libraries: Collection[str]) -> bool:
    """Whether a module attribute is a non-data object worth a name: a function, a class, a ``libraries`` sentinel."""
    if isinstance(obj, types.ModuleType | bool | int | float | complex | str | bytes | tuple | list | dict | set):
        return False
    if obj is None or isinstance(obj, type) or callable(obj):
        return obj is not None
    return type(obj).__module__.partition(".")[0] in libraries


def _defined_in(obj: object, libraries: Collection[str]) -> bool:
    """Whether a library-internal object was defined by one of ``libraries`` (not imported into it from elsewhere).

    Only the public namespaces may name objects from other modules; a private module's ``from pickle import loads``
    does not make ``loads`` loadable.
    """
    owner = obj if isinstance(obj, type) or callable(obj) else type(obj)
    module = getattr(owner, "__module__", None)
    return isinstance(module, str) and module.partition(".")[0] in libraries


_libraries = _LibraryIndex()


def _default_name(obj: object) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise ArgumentError(
            f"{obj!r} has no importable module.qualname (a lambda or a local object); "
            "give it an explicit name: jaxstow.saveable(obj, name='package.thing')"
        )
    return f"{module}.{qualname}"


@overload
def saveable(obj: str, *, name: None = None) -> Callable[[T], T]: ...
@overload
def saveable(obj: T, *, name: str | None = None) -> T: ...
@overload
def saveable(obj: None = None, *, name: str | None = None) -> Callable[[T], T]: ...
def saveable(obj: Any = None, *, name: str | None = None) -> Any:
    """Register a function, class or other non-data object under a name, so that trees holding it can be saved.

    Use it as a call, ``saveable(fn, name="pkg.fn")``, or as a decorator: ``@saveable``, ``@saveable(name="pkg.fn")``
    or FlareJax's ``@saveable("pkg.fn")``. Re-registering a name for another object warns; the newer object wins.

    Args:
        obj: the object; a string here is the name, and a decorator is returned; ``None`` returns a decorator.
        name: the name stored in files; ``module.qualname`` by default (a lambda or a local object needs one).

    Returns:
        ``obj`` itself, or a decorator that registers its argument.

    Raises:
        ArgumentError: no name can be made for ``obj``, or the name is given twice.

    >>> import io, jax.numpy as jnp, jaxstow
    >>> relu6 = jaxstow.saveable(lambda x: jnp.clip(x, 0, 6), name="examples.relu6")
    >>> buffer = io.BytesIO(); jaxstow.save(buffer, {"act": relu6}); _ = buffer.seek(0)
    >>> jaxstow.load(buffer)["act"] is relu6
    True
    """
    if isinstance(obj, str):
        if name is not None:
            raise ArgumentError(f"saveable({obj!r}, name={name!r}) names twice: give the name once")
        return lambda target: saveable(target, name=obj)
    if obj is None:
        return lambda target: saveable(target, name=name)
    key = name if name is not None else _default_name(obj)
    if not key or not isinstance(key, str):
        raise ArgumentError(f"a registered name must be a non-empty string, not {key!r}")
    module = module_of(obj).partition(".")[0]
    if module in FORBIDDEN_MODULES or key.partition(".")[0] in FORBIDDEN_MODULES:
        raise ArgumentError(
            f"saveable({obj!r}, name={key!r}): an object of {module if module in FORBIDDEN_MODULES else key.partition('.')[0]} "
            "reads, writes, imports or runs something, and a file that names it could make a load do so: register a "
            "function of your own that does only what the model needs"
        )
    if (problem := refused_object(obj)) is not None:  # numpy.savetxt, under any name: a file could write with it
        raise ArgumentError(
            f"saveable({obj!r}, name={key!r}): {problem}, which a file may never name, registered or not: register a "
            "function of your own that does only what the model needs"
        )
    if key.partition(".")[0] in known().names:  # a library's name: files would load its object, not this one
        theirs = _libraries.tables().by_name.get(key)
        if theirs is not None and theirs is not obj:
            raise ArgumentError(
                f"saveable(name={key!r}): that name is {theirs!r}'s, which every process loads it as; give {obj!r} a "
                "name of your own, such as 'my_project." + key.rpartition(".")[2] + "'"
            )
    with _registering:
        previous = _registered.get(key)
        if previous is not None and previous is not obj:
            _registered_names.pop(id(previous), None)
        _registered[key] = obj
        _registered_names[id(obj)] = key
    if previous is not None and previous is not obj:
        warnings.warn(
            f"jaxstow.saveable: the name {key!r} was registered for {previous!r} and now names {obj!r}",
            stacklevel=2,
        )
    return obj


def refused_object(obj: object) -> str | None:
    """Why the name policy refuses ``obj`` under every name a library gives it (``numpy.savetxt``), so that it is
    never registered under another; ``None`` for an object it names, or one of no library.

    >>> import numpy as np
    >>> refused_object(np.savetxt), refused_object(np.tanh)
    ('numpy.savetxt is not an activation, an elementwise or reducing function or a scalar type', None)
    """
    tables = _libraries.tables()
    return None if id(obj) in tables.by_id else tables.refused_ids.get(id(obj))


def name_of(obj: object) -> str | None:
    """The name under which ``obj`` is saved, or ``None`` when it is neither registered nor known."""
    name = _registered_names.get(id(obj))
    if name is not None:
        return name
    return _libraries.tables().by_id.get(id(obj))


def attribute_class_name(cls: type) -> str | None:
    """The name of a class whose instances are saved by their attributes, or ``None`` for any other class.

    Those are the classes registered with :func:`saveable` and a known library's ``attribute_classes``. An instance
    is saved as its class's name and its attributes (``__dict__`` and ``__slots__``), and loaded by setting them on
    an instance made without calling ``__init__``.

    >>> import jaxstow
    >>> @jaxstow.saveable(name="examples.Schedule")
    ... class Schedule:
    ...     def __init__(self, steps):
    ...         self.steps = steps
    >>> jaxstow._names.registry.attribute_class_name(Schedule), jaxstow._names.registry.attribute_class_name(dict)
    ('examples.Schedule', None)
    """
    name = _registered_names.get(id(cls))
    if name is None:
        name = name_of(cls)
        if name not in known().attribute_classes:
            return None
    return name if isinstance(cls, type) else None


def type_name(cls: type) -> str:
    """The name of a pytree node type: registered or known if it is, else its ``module.qualname``, once that name
    finds it in its module (a namedtuple named otherwise than its variable would be saved under a name no load finds:
    an :class:`~jaxstow.errors.ArgumentError`)."""
    name = name_of(cls)
    if name:
        return name
    name = _default_name(cls)
    found: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    if found is not cls:
        raise ArgumentError(f"{cls!r} is not {name} in its module: register it with jaxstow.saveable(cls, name=...)")
    return name


def lookup(name: str, *, node_type: bool = False, file: str | None = None, path: str | None = None) -> object:
    """The object a saved name stands for; raises :class:`UnknownNameError` when this process has none.

    With ``node_type=True`` a ``module.qualname`` of an already-imported module is accepted too; the caller must then
    check that the class really is a registered pytree node before using it.
    """
    if name in _registered:  # names are never unregistered
        return _registered[name]
    tables = _libraries.tables()
    if name in tables.by_name:
        return tables.by_name[name]
    if name in tables.refused:
        raise RefusedNameError(name, f"{tables.refused[name]}; {describe_policy()}", file=file, path=path)
    if node_type:
        found = _find_imported(name)
        if isinstance(found, type):
            reason = refusal(name, found)
            if reason is None and issubclass(found, tuple) and name.partition(".")[0] in sys.stdlib_module_names:
                # Any namedtuple is a node to jax; the standard library's are not data (platform's runs `uname`).
                reason = "a namedtuple of Python's standard library, which a file may name only once registered"
            if reason is not None:
                raise RefusedNameError(name, f"{reason}; {describe_policy()}", file=file, path=path)
            return found
    reason = name_refusal(name)  # unregistered, and no registration may give it: never a hint to register it
    if reason is not None:
        raise RefusedNameError(name, f"{reason}; {describe_policy()}", file=file, path=path)
    root = name.partition(".")[0]
    advice = ""
    missing = not_imported([name])
    if missing and root in known().names:
        advice = import_advice(missing[0], missing)
    elif missing:
        advice = f"it belongs to {root}, which is installed but not imported in this process: import {root} first"
        if not node_type:
            advice += f", and register the object as it was when saved: jaxstow.saveable(obj, name={name!r})"
    elif root == "jaxstow":
        module = name.rpartition(".")[0]
        advice = f"it is defined by {module}: import {module} first"
    raise UnknownNameError(name, file=file, path=path, advice=advice, libraries=missing)


def not_imported(names: Iterable[str]) -> list[str]:
    """The modules, sorted, to import before the dotted ``names`` can be looked up; nothing is imported.

    For a known library's name, the shortest of its public namespaces that holds it (``flax.nnx``, which ``import
    flax`` leaves out), else the library; for another name, its top-level module if installed here.

    >>> from jaxstow._names.registry import not_imported
    >>> not_imported(["numpy.tanh", "no_such_package.f"])
    []
    """
    return sorted({module for name in names if isinstance(name, str) and (module := _to_import(name)) is not None})


def _to_import(name: str) -> str | None:
    """The module to import before ``name`` can be looked up, or ``None`` when it is imported or cannot be."""
    root = name.partition(".")[0]
    library = known().library(root)
    if library is None:
        return root if root not in sys.modules and _installed(root) else None
    holding = [space for space in library.public_namespaces if name == space or name.startswith(f"{space}.")]
    module = min(holding, key=len, default=root)
    return None if module in sys.modules else module


def naming_every_library(
    error: UnknownNameError, names: Iterable[str], *, also: str = "the file also names"
) -> UnknownNameError:
    """``error``, about a name of a library not imported, made to name every library that ``names`` (of the file, or
    of the files ``also`` says) belong to and this process has not imported, so that one error says all there is to
    import; ``error`` itself when it is about something else or has nothing to add (``names`` is then not read)."""
    if not error.libraries:
        return error
    libraries = sorted({*error.libraries, *not_imported(names)})
    if len(libraries) == len(error.libraries):
        return error
    advice = import_advice(_to_import(error.name) or error.libraries[0], libraries, also=also)
    return UnknownNameError(error.name, file=error.file, path=error.path, advice=advice, libraries=libraries)


def every_library_of(errors: Iterable[BaseException | None]) -> UnknownNameError | None:
    """The first of ``errors`` (those of a step's files, in order; ``None`` for a file that loaded), when it is about
    a library not imported, made to name the libraries not imported that the others are about too; ``None`` when
    the first is to be raised as it is."""
    found = [error for error in errors if error is not None]
    if not found or not isinstance(found[0], UnknownNameError):
        return None
    others = [library for error in found[1:] if isinstance(error, UnknownNameError) for library in error.libraries]
    combined = naming_every_library(found[0], others, also="the step's files also name")
    return None if combined is found[0] else combined


def _installed(module: str) -> bool:
    """Whether a top-level module can be imported (found on the path), without importing it."""
    try:
        return bool(module.isidentifier()) and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _find_imported(name: str) -> object | None:
    """Resolve ``module.qualname`` against modules already imported, without importing anything."""
    parts = name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:split]))
        if module is None:
            continue
        obj: object = module
        for attribute in parts[split:]:
            namespace = vars(obj) if isinstance(obj, types.ModuleType | type) else {}
            if attribute not in namespace:
                return None
            obj = namespace[attribute]
        return obj
    return None
