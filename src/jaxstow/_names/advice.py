"""What to do about an object of a known library that a file cannot name.

For the objects that need more advice than "register it": an optax transformation, which is a closure.

>>> import optax
>>> from jaxstow._names.advice import unsaveable_advice
>>> print(unsaveable_advice(optax.adam(1e-3)))
an optax transformation, a closure jaxstow cannot name by itself: register it where it is made, tx = jaxstow.saveable(optax.adam(1e-3), name="my_project.adam") (and in the process that loads it), or leave it out of the file: save nnx.state(optimizer) and restore into a live optimizer, nnx.update(optimizer, jaxstow.load(path, like=nnx.state(optimizer)))
>>> unsaveable_advice(object()) is None
True
"""

from __future__ import annotations

__all__ = ["unsaveable_advice"]

_OPTAX_TRANSFORMATIONS = ("GradientTransformation", "GradientTransformationExtraArgs")


def unsaveable_advice(obj: object) -> str | None:
    """The advice for ``obj`` when it is an object that registering alone does not describe well; ``None`` otherwise."""
    kind = type(obj)
    if kind.__module__.startswith("optax") and kind.__name__ in _OPTAX_TRANSFORMATIONS:
        return (
            "an optax transformation, a closure jaxstow cannot name by itself: register it where it is made, "
            'tx = jaxstow.saveable(optax.adam(1e-3), name="my_project.adam") (and in the process that loads it), or '
            "leave it out of the file: save nnx.state(optimizer) and restore into a live optimizer, "
            "nnx.update(optimizer, jaxstow.load(path, like=nnx.state(optimizer)))"
        )
    return None
