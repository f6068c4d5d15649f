"""A digest of what a sampling run's functions compute: the code of a log density, a numpyro model or a ``draw``
function, the values it closes over, and the values of its module that it reads (data at the top of a script), down
through the functions it calls. Recorded in the run's file, so that a run continued with another model or other data
is refused rather than mixing two posteriors' draws.

Code counts by its syntax tree (not its line numbers or comments; the same under every Python), or by its bytecode
where its source is not at hand; values as :func:`~jaxstow.io.argument_digest.argument_digest` counts them; a
method by its code and its object's data; other callables (a class, a library's function object) by their names,
and a callable object's data too.

>>> import jax.numpy as jnp
>>> from jaxstow.io.code_digest import code_digest
>>> y = jnp.arange(3.0)
>>> def logdensity(mu):
...     return -jnp.sum((y - mu) ** 2)
>>> before = code_digest(logdensity)
>>> y = y + 1  # the data at the top of the script, changed
>>> code_digest(logdensity) == before
False
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import os
import sysconfig
import textwrap
import types
from typing import Any

from jaxstow.io.argument_digest import argument_digest

__all__ = ["code_digest"]

#: How many calls down the functions a function reads are followed (a model calling a helper calling another).
_DEPTH = 4
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def code_digest(made: Any) -> str:
    """The hex digest of ``made`` (a function, a ``functools.partial``, or a list or tuple of them; see the module)."""
    digest = hashlib.blake2b(digest_size=16)
    _feed(made, _DEPTH, digest, set())
    return digest.hexdigest()


def _feed(made: Any, depth: int, digest: Any, seen: set[int]) -> None:
    if id(made) in seen or isinstance(made, types.ModuleType):
        return
    seen.add(id(made))
    if isinstance(made, list | tuple):
        parts: list[Any] = list(made)
    elif isinstance(made, functools.partial):
        parts = [made.func, *made.args, *sorted(made.keywords.items())]
    elif inspect.isfunction(made) and depth > 0:
        code, installed = made.__code__, _installed(made.__code__)  # a library's: by its name, and what it wraps
        digest.update((f"{made.__module__}.{made.__qualname__}" if installed else _code_text(code)).encode())
        cells = [cell.cell_contents for cell in made.__closure__ or () if _filled(cell)]
        read = (
            [] if installed else [made.__globals__[name] for name in sorted(_names(code)) if name in made.__globals__]
        )
        parts = [*cells, *read, *(made.__defaults__ or ()), *sorted((made.__kwdefaults__ or {}).items())]
        depth -= 0 if installed else 1
    elif inspect.ismethod(made):  # a model object's method: its code, and the object's data
        parts = [made.__func__, made.__self__]
    elif callable(made):  # a class, a builtin, a library's object: by its name, the same in every process
        wrapped = getattr(made, "__wrapped__", None)  # a jitted function's
        digest.update(
            f"{getattr(made, '__module__', '')}.{getattr(made, '__qualname__', type(made).__qualname__)}".encode()
        )
        parts = [wrapped] if inspect.isfunction(wrapped) else []
        if not isinstance(made, type) and not inspect.isbuiltin(made) and wrapped is None:
            digest.update(argument_digest(made).encode())  # a callable object (an equinox module): its data
    else:
        digest.update(argument_digest(made).encode())
        return
    for part in parts:
        _feed(part, depth, digest, seen)


def _installed(code: types.CodeType) -> bool:
    """Whether ``code`` is an installed library's (or Python's own): counted by its name, as its version may differ
    from machine to machine while the run's own code does not."""
    file = os.path.abspath(code.co_filename)
    return any(part in ("site-packages", "dist-packages") for part in file.split(os.sep)) or file.startswith(_STDLIB)


def _code_text(code: types.CodeType) -> str:
    """A code object's syntax tree, the same under every Python; where its source is not at hand, its bytecode,
    constants and names, of the code objects it holds too (lambdas, comprehensions)."""
    try:
        return _canonical(ast.parse(textwrap.dedent(inspect.getsource(code))))
    except (OSError, TypeError, SyntaxError, ValueError):  # no source (typed at a prompt), or a lambda's line alone
        pass
    constants = [
        _code_text(value) if isinstance(value, types.CodeType) else _constant(value) for value in code.co_consts
    ]
    return f"{code.co_code.hex()}|{constants}|{code.co_names}|{code.co_varnames}"


def _canonical(node: Any) -> str:
    """A syntax tree as text, without the fields one Python has and another lacks or shows otherwise (empty ones)."""
    if isinstance(node, ast.AST):
        fields = [
            f"{name}={_canonical(value)}"
            for name, value in ast.iter_fields(node)
            if value not in (None, []) and name not in ("type_params", "type_comment", "kind")
        ]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(map(_canonical, node))}]"
    return repr(node)


def _constant(value: Any) -> str:
    """A constant as text that is the same in every process (a frozenset's order is not)."""
    if isinstance(value, frozenset):
        return f"frozenset({sorted(map(_constant, value))})"
    if isinstance(value, tuple):
        return f"({', '.join(map(_constant, value))})"
    return repr(value)


def _names(code: types.CodeType) -> set[str]:
    """The names that ``code`` and the code objects it holds look up (globals among them)."""
    names = set(code.co_names)
    for value in code.co_consts:
        if isinstance(value, types.CodeType):
            names |= _names(value)
    return names


def _filled(cell: Any) -> bool:
    try:
        return cell.cell_contents is not _EMPTY
    except ValueError:  # a cell not filled yet
        return False


_EMPTY = object()
