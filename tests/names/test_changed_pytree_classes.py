"""A pytree class that is a dataclass, changed since the save by a field added or renamed (a FlareJax module):
refused naming the node and the field, never rebuilt without it.

The class's own unflatten sets the attributes the file names: the instance lacked the new field, and read the class's
default for it, so the loaded model computed something else than the saved one, with no error.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow.errors import StructureMismatchError


class ScaledAndShifted(eqx.Module):
    w: jax.Array
    scale: float = eqx.field(static=True, default=2.0)
    shift: float = eqx.field(static=True, default=0.5)


def _saved_then_changed(tmp_path: Path, before: type, after: type, name: str) -> Path:
    jaxstow.saveable(before, name=name)
    jaxstow.save(tmp_path / "model.jxs", {"opt": [1, {"net": before(jnp.eye(2))}]})
    with pytest.warns(UserWarning, match="now names"):
        jaxstow.saveable(after, name=name)
    return tmp_path / "model.jxs"


def test_a_flarejax_dataclass_module_with_a_field_added_since_the_save_is_refused(tmp_path: Path) -> None:
    flr = pytest.importorskip("flarejax")

    @dataclasses.dataclass
    class Net(flr.Module):
        w: jax.Array
        scale: float = 2.0

    @dataclasses.dataclass
    class Grown(flr.Module):
        w: jax.Array
        scale: float = 2.0
        shift: float = 0.5  # added after the file was saved: the loaded model read the default, 0.5

    file = _saved_then_changed(tmp_path, Net, Grown, "tests.changed.FlrNet")
    with pytest.raises(
        StructureMismatchError, match=r"'opt/1/net': the dataclass tests\.changed\.FlrNet .*\['shift'\]"
    ):
        jaxstow.load(file)


def test_an_unchanged_equinox_module_loads(tmp_path: Path) -> None:
    """Its unflatten sets every field: nothing is refused."""
    jaxstow.saveable(ScaledAndShifted, name="tests.unchanged.EqxScaled")
    jaxstow.save(tmp_path / "model.jxs", ScaledAndShifted(jnp.eye(2), 3.0, 1.0))
    loaded = jaxstow.load(tmp_path / "model.jxs")
    assert (loaded.scale, loaded.shift) == (3.0, 1.0)
    assert (loaded.w == jnp.eye(2)).all()


def test_a_flarejax_module_whose_init_sets_an_attribute_renamed_since_the_save_is_refused(tmp_path: Path) -> None:
    # A plain FlareJax module (no dataclass) loaded with the attribute missing: the class's default, 1e-5, was read
    # in place of the saved 1e-3 (or an AttributeError came at the first call), with no error.
    flr = pytest.importorskip("flarejax")

    class Norm(flr.Module):
        def __init__(self) -> None:
            self.eps = 1e-3
            self.w = jnp.ones(2)

    class Renamed(flr.Module):
        epsilon = 1e-5

        def __init__(self, epsilon: float = 1e-5) -> None:
            self.epsilon = epsilon
            self.w = jnp.ones(2)

    jaxstow.saveable(Norm, name="tests.changed.FlrNorm")
    jaxstow.save(tmp_path / "model.jxs", {"net": Norm()})
    assert jaxstow.load(tmp_path / "model.jxs")["net"].eps == 1e-3  # unchanged, it loads
    with pytest.warns(UserWarning, match="now names"):
        jaxstow.saveable(Renamed, name="tests.changed.FlrNorm")
    with pytest.raises(
        StructureMismatchError, match=r"'net': the class tests\.changed\.FlrNorm sets the attributes .*\['epsilon'\]"
    ):
        jaxstow.load(tmp_path / "model.jxs")
