"""``load_var_collection`` into variables shaped like Objax's whose ``assign`` takes no ``check=`` (as its docs
allow), and into ones whose ``assign`` fails: the first load, and no variable changed by the second.

Every ``assign`` was called with Objax's ``check=False``: a variable without it raised Python's ``TypeError`` after
the variables before it were assigned, so a failed load left the collection half loaded.
"""

from __future__ import annotations

import io
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import objax as objax_io
from jaxstow.errors import ArgumentError


class Var:
    def __init__(self, value: Any) -> None:
        self.value = value

    def assign(self, value: Any, check: bool = True) -> None:
        self.value = value


class PlainVar(Var):
    def assign(self, value: Any) -> None:  # type: ignore[override]
        self.value = value


class FrozenVar(Var):
    def assign(self, value: Any, check: bool = True) -> None:
        raise RuntimeError("this variable is frozen")


def _saved() -> io.BytesIO:
    buffer = io.BytesIO()
    objax_io.save_var_collection(buffer, {"a": Var(jnp.ones(3)), "b": Var(jnp.ones(2))})
    buffer.seek(0)
    return buffer


def test_a_variable_whose_assign_takes_no_check_is_loaded() -> None:
    collection = {"a": Var(jnp.zeros(3)), "b": PlainVar(jnp.zeros(2))}
    objax_io.load_var_collection(_saved(), collection)
    np.testing.assert_array_equal(collection["a"].value, np.ones(3))
    np.testing.assert_array_equal(collection["b"].value, np.ones(2))


def test_a_failed_assign_changes_no_variable() -> None:
    collection = {"a": Var(jnp.zeros(3)), "b": FrozenVar(jnp.zeros(2))}
    with pytest.raises(
        ArgumentError, match=r"a variable's assign\(\) failed \(RuntimeError: this variable is frozen\)"
    ):
        objax_io.load_var_collection(_saved(), collection)
    np.testing.assert_array_equal(collection["a"].value, np.zeros(3))
