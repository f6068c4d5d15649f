"""The attributes a class's ``__init__`` sets on every call, read from its source, never run.

An instance saved by its attributes is rebuilt without calling ``__init__``: if the class has since renamed or added
an attribute, the instance would lack it, or silently read a class-level default of that name. The assignments
``self.x = ...`` among the statements of ``__init__``'s own body, before the first that may return early, run on every
call that makes an instance; a name counts only where the compiled ``__init__`` stores an attribute of that name too
(a source file edited since its import says nothing). Attributes set under an ``if``, a loop or a ``try``, by a
parent's ``__init__`` or through a property are not counted: the check refuses only what surely changed.

>>> class Scaler:
...     def __init__(self, mean, scale=1.0):
...         self.mean = mean
...         if scale <= 0:
...             raise ValueError(scale)
...         self.scale, self.__seen = scale, 0
...         if mean is None:
...             return
...         self.offset = -mean
>>> always_set(Scaler)
('_Scaler__seen', 'mean', 'scale')
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types

from jaxstow._format.attribute_paths import mangled

__all__ = ["always_set"]


def always_set(cls: type) -> tuple[str, ...]:
    """The attributes, as an instance's ``__dict__`` or slots hold them, that every call of ``cls.__init__`` sets;
    empty where that cannot be told (no Python ``__init__``, no source, a custom ``__setattr__``)."""
    if getattr(cls, "__setattr__", None) is not object.__setattr__:
        return ()
    owner = next((base for base in cls.__mro__ if "__init__" in vars(base)), object)
    init = inspect.unwrap(vars(owner)["__init__"]) if owner is not object else None
    if not isinstance(init, types.FunctionType):
        return ()
    stored = {mangled(owner, name) for name in _assigned(init)} & set(init.__code__.co_names)
    return tuple(sorted(name for name in stored if not _stored_elsewhere(cls, name)))


@functools.lru_cache(maxsize=256)
def _assigned(init: types.FunctionType) -> frozenset[str]:
    """The names ``__init__``'s own body assigns as attributes of its first argument before it may return."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    function = tree.body[0] if tree.body else None
    if not isinstance(function, ast.FunctionDef) or not function.args.args:
        return frozenset()
    receiver = function.args.args[0].arg
    if function.name != init.__name__ or receiver != init.__code__.co_varnames[0]:
        return frozenset()  # the source on disk is not this function's any more
    names: set[str] = set()
    for statement in function.body:
        if _may_return(statement):
            break
        if isinstance(statement, ast.Assign):
            names.update(_attributes_of(receiver, statement.targets))
        elif isinstance(statement, ast.AnnAssign):
            names.update(_attributes_of(receiver, [statement.target]))
    return frozenset(names)


def _attributes_of(receiver: str, targets: list[ast.expr]) -> list[str]:
    """The attribute names of ``receiver`` that assignment ``targets`` (``self.a``, ``self.b, x = ...``) set."""
    found = []
    for target in targets:
        parts = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
        for part in parts:
            if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == receiver:
                found.append(part.attr)
    return found


def _may_return(statement: ast.stmt) -> bool:
    """Whether ``statement`` holds a ``return`` of the function (not of a function or class defined inside it)."""
    pending: list[ast.AST] = [statement]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Return):
            return True
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))
    return False


def _stored_elsewhere(cls: type, name: str) -> bool:
    """Whether assigning the attribute ``name`` goes through a descriptor other than a slot (a property's setter)."""
    found = inspect.getattr_static(cls, name, None)
    return hasattr(type(found), "__set__") and not isinstance(found, types.MemberDescriptorType)
