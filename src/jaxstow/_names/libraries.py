"""The libraries whose objects a file may name without registration, and the hook that makes a library one of them.

A library is known by its top-level module; :func:`register_library` says where its names are found and which name
policy they pass. The core registers jax, numpy and ml_dtypes (numeric) and equinox, flax and optax (model); a face
registers the libraries it stands in for (:mod:`jaxstow.flarejax`). Registering imports nothing, and the set of
libraries is published whole (:func:`known`), never half registered. Earlier libraries' names win where two name
one object.

>>> from jaxstow._names.libraries import known, register_library
>>> known().names[:6]
('jax', 'numpy', 'ml_dtypes', 'equinox', 'flax', 'optax')
>>> known().policy_of("optax.adam"), known().policy_of("numpy.tanh"), known().policy_of("os.system")
('model', 'numeric', None)
>>> register_library("optax", public_namespaces=("optax",), searched_inside=True)
Traceback (most recent call last):
jaxstow.errors.ArgumentError: the library 'optax' is registered already, with other settings (...); a library is registered once
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterable
from typing import Literal, get_args

from jaxstow.errors import ArgumentError

__all__ = ["Libraries", "Library", "Policy", "known", "register_library"]

#: The name policy a library's objects pass: ``"numeric"`` or ``"model"``.
Policy = Literal["numeric", "model"]


@dataclasses.dataclass(frozen=True)
class Library:
    """A library whose objects a file may name: see :func:`register_library` for each field."""

    name: str
    public_namespaces: tuple[str, ...]
    searched_inside: bool
    attribute_classes: frozenset[str]
    policy: Policy


@dataclasses.dataclass(frozen=True)
class Libraries:
    """The known libraries, in the order they were registered.

    One value, replaced whole by each registration; what it derives from them is computed once.
    """

    libraries: tuple[Library, ...]

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """The libraries' top-level modules."""
        return tuple(library.name for library in self.libraries)

    @functools.cached_property
    def public_namespaces(self) -> tuple[str, ...]:
        """Every library's public namespaces, library by library."""
        return tuple(namespace for library in self.libraries for namespace in library.public_namespaces)

    @functools.cached_property
    def searched_inside(self) -> frozenset[str]:
        """The libraries whose private modules are searched too."""
        return frozenset(library.name for library in self.libraries if library.searched_inside)

    @functools.cached_property
    def attribute_classes(self) -> frozenset[str]:
        """The names of the plain classes saved by their attributes."""
        return frozenset(name for library in self.libraries for name in library.attribute_classes)

    @functools.cached_property
    def _by_name(self) -> dict[str, Library]:
        return {library.name: library for library in self.libraries}

    def library(self, name: str) -> Library | None:
        """The library whose top-level module is ``name``, or ``None``."""
        return self._by_name.get(name)

    def policy_of(self, name: str) -> Policy | None:
        """The policy of the library a dotted ``name`` belongs to, or ``None`` for a name of no known library."""
        library = self.library(name.partition(".")[0])
        return None if library is None else library.policy


_registering = threading.Lock()
_known = Libraries(())


def known() -> Libraries:
    """The libraries registered so far."""
    return _known


def register_library(
    name: str,
    *,
    public_namespaces: Iterable[str] = (),
    searched_inside: bool = False,
    attribute_classes: Iterable[str] = (),
    policy: Policy = "model",
) -> Library:
    """Make ``name`` (a top-level module) a known library, whose objects a file may name once it is imported.

    Args:
        name: the library's top-level module, such as ``"optax"``.
        public_namespaces: modules whose public attributes are nameable as ``module.attribute``, each ``name`` or
            inside it; the earlier of two that hold one object names it.
        searched_inside: whether the module-level objects that the library's own modules define (private ones too)
            are nameable, for defaults that its public namespaces do not hold.
        attribute_classes: ``module.qualname`` of the library's plain classes that are saved by their attributes.
        policy: ``"model"`` (classes and functions, no serialisation, file or debugging helper) or ``"numeric"``
            (elementwise and reducing functions and scalar types only); see :mod:`jaxstow._names.policy`.

    Returns:
        The registered :class:`Library`.

    Raises:
        ArgumentError: a name that is not a top-level module, a namespace or class outside the library, an unknown
            policy, or a library registered already with other settings.
    """
    global _known
    if not isinstance(name, str) or not name.isidentifier():
        raise ArgumentError(f"a library is named by its top-level module, such as 'optax', not {name!r}")
    if policy not in get_args(Policy):
        raise ArgumentError(f"policy must be one of {get_args(Policy)}, not {policy!r}")
    library = Library(
        name, _inside(name, public_namespaces, "public_namespaces"), bool(searched_inside),
        frozenset(_inside(name, attribute_classes, "attribute_classes")), policy,
    )  # fmt: skip
    with _registering:
        existing = _known.library(name)
        if existing is not None and existing != library:
            raise ArgumentError(
                f"the library {name!r} is registered already, with other settings ({existing}); a library is "
                "registered once"
            )
        if existing is None:
            _known = Libraries((*_known.libraries, library))
    return library


def _inside(library: str, names: Iterable[str], argument: str) -> tuple[str, ...]:
    """``names`` as a tuple, each checked to be ``library`` or a dotted name inside it."""
    if isinstance(names, str):
        raise ArgumentError(f"{argument} takes a sequence of dotted names, not the single string {names!r}")
    found = tuple(names)
    outside = [item for item in found if not isinstance(item, str) or item.partition(".")[0] != library]
    if outside:
        raise ArgumentError(
            f"{argument} of the library {library!r} must name {library} or what is inside it: {outside}"
        )
    return found


register_library(
    "jax",
    public_namespaces=(
        "jax", "jax.nn", "jax.nn.initializers", "jax.numpy", "jax.numpy.linalg", "jax.lax", "jax.random",
        "jax.scipy.special", "jax.tree_util", "jax.dtypes",
    ),
    policy="numeric",
)  # fmt: skip
register_library("numpy", public_namespaces=("numpy",), policy="numeric")
register_library("ml_dtypes", public_namespaces=("ml_dtypes",), policy="numeric")
register_library("equinox", public_namespaces=("equinox", "equinox.nn"), searched_inside=True)
register_library("flax", public_namespaces=("flax.linen", "flax.nnx", "flax.struct", "flax.core"), searched_inside=True)
register_library("optax", public_namespaces=("optax", "optax.tree_utils"), searched_inside=True)
