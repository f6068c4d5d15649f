"""Orbax's names of a checkpoint manager's methods that jaxstow names otherwise: the error names jaxstow's.

>>> import tempfile
>>> from jaxstow import CheckpointManager
>>> with CheckpointManager(tempfile.mkdtemp()) as manager:
...     manager.wait_until_finished()
Traceback (most recent call last):
AttributeError: 'CheckpointManager' object has no attribute 'wait_until_finished' (orbax's name): use manager.wait()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

__all__ = ["OrbaxNames"]

#: Orbax's name, and the call of jaxstow's manager that does what it does.
RENAMED = {"all_steps": "steps()", "wait_until_finished": "wait()"}


class OrbaxNames:
    """A base whose missing attributes of :data:`RENAMED` raise an ``AttributeError`` naming jaxstow's call."""

    if not TYPE_CHECKING:  # a type checker still finds every other missing attribute

        def __getattr__(self, name: str) -> NoReturn:
            missing = f"{type(self).__name__!r} object has no attribute {name!r}"
            if name in RENAMED:
                missing += f" (orbax's name): use manager.{RENAMED[name]}"
            raise AttributeError(missing, name=name, obj=self)
