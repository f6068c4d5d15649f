"""A plain registered class whose ``__init__`` changed since the save: refused, never rebuilt without an attribute."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow.errors import StructureMismatchError


def _save_then_change(tmp_path: Path, changed: type) -> Path:
    class Optimizer:
        def __init__(self, rate: float, width: int) -> None:
            self.rate = rate
            self.width = width

    name = f"tests.changed.{changed.__name__}"
    jaxstow.saveable(Optimizer, name=name)
    jaxstow.save(tmp_path / "run.jxs", {"opt": Optimizer(0.5, 3), "w": jnp.ones(2)})
    with pytest.warns(UserWarning, match="now names"):
        jaxstow.saveable(changed, name=name)
    return tmp_path / "run.jxs"


class Renamed:  # the next version of the code: rate renamed, with a class-level default the instance would read
    learning_rate = 1e-3

    def __init__(self, learning_rate: float, width: int) -> None:
        self.learning_rate = learning_rate
        self.width = width


class Grown:  # the next version: an attribute added, set by a tuple assignment after a check
    def __init__(self, rate: float, width: int, decay: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError(rate)
        self.rate, self.width, self.decay = rate, width, decay


@pytest.mark.parametrize(("changed", "missing"), [(Renamed, "learning_rate"), (Grown, "decay")])
def test_a_plain_class_whose_init_changed_since_the_save_is_refused(
    tmp_path: Path, changed: type, missing: str
) -> None:
    file = _save_then_change(tmp_path, changed)
    # It loaded, and Renamed's instance read learning_rate 0.001, the class's default, instead of the saved 0.5.
    with pytest.raises(
        StructureMismatchError,
        match=rf"run\.jxs does not fit .*\n  - 'opt': the class tests\.changed\.{changed.__name__} sets the attributes "
        rf".* in __init__ now, the file holds the attributes \['rate', 'width'\]: \['{missing}'\] would be missing "
        r"from the instance \(renamed or added since the save\?\)\nLoad the file with the class as it was saved",
    ):
        jaxstow.load(file)


class Conditional:  # unchanged since the save: some attributes are set only on some calls, or elsewhere
    def __init__(self, rate: float, decay: float | None = None) -> None:
        self.rate = rate
        self._scale = 1.0
        if decay is not None:
            self.decay = decay
        self.__calls = 0
        if rate > 1:
            return
        self.small = True

    @property
    def scale(self) -> float:
        return self._scale

    @scale.setter
    def scale(self, value: float) -> None:
        self._scale = value


def test_attributes_set_on_some_calls_only_or_through_a_property_load_as_saved(tmp_path: Path) -> None:
    jaxstow.saveable(Conditional, name="tests.changed.Conditional")
    big = Conditional(2.0)
    big.scale = 3.0
    jaxstow.save(tmp_path / "run.jxs", {"opt": big})
    loaded = jaxstow.load(tmp_path / "run.jxs")["opt"]
    assert vars(loaded) == {"rate": 2.0, "_scale": 3.0, "_Conditional__calls": 0}
    del loaded._Conditional__calls
    jaxstow.save(tmp_path / "again.jxs", {"opt": loaded})
    with pytest.raises(StructureMismatchError, match=r"\['_Conditional__calls'\] would be missing"):
        jaxstow.load(tmp_path / "again.jxs")


def test_a_source_file_edited_since_its_import_is_not_taken_for_the_class(tmp_path: Path, monkeypatch) -> None:
    module = tmp_path / "edited_model.py"
    module.write_text(
        textwrap.dedent(
            """
            class Model:
                def __init__(self, rate):
                    self.rate = rate
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = importlib.import_module("edited_model")
    monkeypatch.setitem(sys.modules, "edited_model", model)
    jaxstow.saveable(model.Model, name="tests.changed.Model")
    jaxstow.save(tmp_path / "run.jxs", {"m": model.Model(0.5)})
    module.write_text(module.read_text().replace("rate", "learning_rate"))  # edited, not imported again
    assert vars(jaxstow.load(tmp_path / "run.jxs")["m"]) == {"rate": 0.5}
