"""What to do about an object that a file names and this process cannot rebuild, or that a file cannot name.

For the objects that need more advice than "register it": an optax transformation, which is a closure; and the
objects of libraries that are not imported yet, all of which one error names at once.

>>> import optax
>>> from jaxstow._names.advice import import_advice, unsaveable_advice
>>> print(unsaveable_advice(optax.adam(1e-3)))
an optax transformation, a closure jaxstow cannot name by itself: register it where it is made, tx = jaxstow.saveable(optax.adam(1e-3), name="my_project.adam") (and in the process that loads it), or leave it out of the file: save nnx.state(optimizer) and restore into a live optimizer, nnx.update(optimizer, jaxstow.load(path, like=nnx.state(optimizer)))
>>> unsaveable_advice(type("Mine", (), {})()) is None
True
>>> print(import_advice("optax", ["equinox", "flax", "optax"]))
it belongs to optax, and the file also names objects of equinox and flax; none of these libraries is imported in this process: import equinox, flax and optax first
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxstow._names.policy import FORBIDDEN_MODULES, module_of
from jaxstow.errors import UnsaveableObjectError

__all__ = ["import_advice", "unsaveable_advice"]

_OPTAX_TRANSFORMATIONS = ("GradientTransformation", "GradientTransformationExtraArgs")


def unsaveable_advice(obj: object, refused: str | None = None) -> str | None:
    """The advice for ``obj`` when it is an object that registering alone does not describe well; ``None`` otherwise.
    ``refused``: why the name policy refuses ``obj`` under its library's names, if it does."""
    kind = type(obj)
    if _is_array(obj):
        return (
            "an array where only static data may go (an equinox static field, an attribute of a registered plain "
            "class, a node's auxiliary data; a FlareJax module keeps numpy arrays there), which a file keeps as JSON: "
            "make it a pytree field (not static; in a FlareJax module, hold jnp.asarray(array)), or "
            "make the plain class a pytree (jax.tree_util.register_pytree_node_class), so that it is saved as a "
            "tensor, or hold a tuple of its values (tuple(array.tolist()))"
        )
    root = module_of(obj).partition(".")[0]
    if root in FORBIDDEN_MODULES and UnsaveableObjectError.advises_registering(obj):
        return (
            f"an object of {root}, which no file may name (registering it is refused: such objects read, write, "
            "import or run something): keep a plain value of it in the tree instead, such as a string, a number or "
            "a tuple of them"
        )
    if refused is not None and UnsaveableObjectError.advises_registering(obj):
        return (
            f"not nameable in a file: {refused}, which no file may name (registering it is refused): pass a function "
            "of your own that does only what the model needs, registered with jaxstow.saveable(fn, name=...)"
        )
    if kind.__module__.startswith("optax") and kind.__name__ in _OPTAX_TRANSFORMATIONS:
        return (
            "an optax transformation, a closure jaxstow cannot name by itself: register it where it is made, "
            'tx = jaxstow.saveable(optax.adam(1e-3), name="my_project.adam") (and in the process that loads it), or '
            "leave it out of the file: save nnx.state(optimizer) and restore into a live optimizer, "
            "nnx.update(optimizer, jaxstow.load(path, like=nnx.state(optimizer)))"
        )
    return None


def _is_array(obj: object) -> bool:
    """Whether ``obj`` is a numpy array, a jax array or a torch tensor, told by their modules (none imported here)."""
    module = type(obj).__module__
    return type(obj).__name__ in ("ndarray", "ArrayImpl", "PRNGKeyArray", "Tensor", "Array") and module.split(".")[
        0
    ] in (
        "numpy",
        "jaxlib",
        "jax",
        "torch",
    )


def import_advice(library: str, libraries: Sequence[str], *, also: str = "the file also names") -> str:
    """What to import before loading a name of ``library``, when the file (``also`` says which files) names objects of
    ``libraries`` (sorted, ``library`` among them), none of them imported in this process."""
    others = [other for other in libraries if other != library]
    if not others:
        return f"it belongs to {library}, which is not imported in this process: import {library} first"
    return (
        f"it belongs to {library}, and {also} objects of {_listed(others)}; none of these libraries is imported in "
        f"this process: import {_listed(libraries)} first"
    )


def _listed(names: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
