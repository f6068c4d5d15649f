"""Plain Python classes registered with ``saveable``: saved by their attributes, rebuilt without ``__init__``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._format.skeleton import decode_value
from jaxstow.errors import FormatError, StructureMismatchError, UnsaveableObjectError

INIT_CALLS: list[str] = []


@jaxstow.saveable(name="tests.Schedule")
class Schedule:
    """A plain class whose ``__init__`` must not run on load."""

    def __init__(self, steps: int, name: str) -> None:
        INIT_CALLS.append(name)
        self.steps = steps
        self.name = name
        self.milestones = [steps // 2, (0.1, None)]


@jaxstow.saveable(name="tests.Slotted")
class Slotted:
    __slots__ = ("rate", "unset")

    def __init__(self, rate: float) -> None:
        self.rate = rate


@jaxstow.saveable(name="tests.Frozen")
@dataclasses.dataclass(frozen=True)
class Frozen:
    key: str
    inner: Schedule | None = None


class Unregistered:
    def __init__(self) -> None:
        self.x = 1


def test_an_instance_comes_back_with_its_attributes_and_without_calling_init(tmp_path: Path) -> None:
    tree = {"schedule": Schedule(10, "warmup"), "w": jnp.ones(3)}
    jaxstow.save(tmp_path / "run.jxs", tree)
    INIT_CALLS.clear()
    loaded = jaxstow.load(tmp_path / "run.jxs")
    assert INIT_CALLS == []
    schedule = loaded["schedule"]
    assert type(schedule) is Schedule
    assert vars(schedule) == {"steps": 10, "name": "warmup", "milestones": [5, (0.1, None)]}
    np.testing.assert_array_equal(loaded["w"], np.ones(3))


def test_slots_frozen_dataclasses_and_nesting(tmp_path: Path) -> None:
    tree = {"slotted": Slotted(0.5), "frozen": Frozen("a", Schedule(4, "inner"))}
    jaxstow.save(tmp_path / "run.npz", tree)
    loaded = jaxstow.load(tmp_path / "run.npz")
    assert loaded["slotted"].rate == 0.5 and not hasattr(loaded["slotted"], "unset")
    frozen = loaded["frozen"]
    assert type(frozen) is Frozen and frozen.key == "a" and frozen.inner.steps == 4
    assert hash(frozen) == hash(Frozen("a", frozen.inner))


@jaxstow.saveable(name="tests.PrivateSlots")
class PrivateSlots:
    __slots__ = ("__scale", "width")

    def __init__(self, scale: float, width: int) -> None:
        self.__scale = scale
        self.width = width

    @property
    def scale(self) -> float:
        return self.__scale


@jaxstow.saveable(name="tests.SlotsAgain")
class SlotsAgain(Slotted):
    __slots__ = ("depth", "rate")  # declares its parent's slot again, as Python allows


def test_private_slots_and_a_slot_declared_again_come_back(tmp_path: Path) -> None:
    # A private slot was looked up by its bare name and silently left out; a slot declared again was saved twice.
    again = SlotsAgain(0.25)
    again.depth = 3
    jaxstow.save(tmp_path / "run.jxs", {"private": PrivateSlots(0.5, 64), "again": again})
    loaded = jaxstow.load(tmp_path / "run.jxs")
    assert (loaded["private"].scale, loaded["private"].width) == (0.5, 64)
    assert (loaded["again"].rate, loaded["again"].depth) == (0.25, 3)


def test_an_unregistered_class_is_refused_naming_the_file_and_the_leaf(tmp_path: Path) -> None:
    with pytest.raises(UnsaveableObjectError, match=r"leaf 'config' of .*run\.jxs.*jaxstow\.saveable"):
        jaxstow.save(tmp_path / "run.jxs", {"config": Unregistered(), "w": jnp.ones(1)})
    assert not (tmp_path / "run.jxs").exists()


def test_an_attribute_that_is_not_a_value_is_refused_with_its_path(tmp_path: Path) -> None:
    schedule = Schedule(3, "x")
    schedule.steps = Unregistered()  # type: ignore[assignment]
    with pytest.raises(UnsaveableObjectError, match=r"leaf 'sched/steps'"):
        jaxstow.save(tmp_path / "run.jxs", {"sched": schedule})


@jaxstow.saveable(name="tests.attributes.Pair")
class Pair(tuple):  # a subclass of a builtin value: never saved by its attributes
    pass


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"object": "builtins.dict", "attrs": []}, "names no class whose instances are saved by their attributes"),
        ({"object": "tests.attributes.Pair", "attrs": [["a", 1]]}, "a subclass of a builtin value"),
        ({"object": "jax.nn.relu", "attrs": []}, "names no class whose instances are saved by their attributes"),
        ({"object": "tests.Schedule", "attrs": [["__class__", {"ref": "tests.Frozen"}]]}, "cannot be an attribute"),
        ({"object": "tests.Schedule", "attrs": [[3, 1]]}, "cannot be an attribute"),
        ({"object": "tests.Schedule", "attrs": [["steps"]]}, "unreadable value"),
        ({"object": "tests.Schedule", "attrs": [["steps", 3], ["name", "x"], ["steps", 4]]}, "'steps' is named twice"),
    ],
)
def test_a_file_cannot_make_other_objects_or_set_special_attributes(data: dict, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        decode_value(data, path="leaf", file="crafted.jxs")


@jaxstow.saveable("tests.Counter")  # FlareJax's form: the name as the only argument
class Counter:
    def __init__(self, start: int) -> None:
        self.count = start


def test_the_flarejax_forms_of_saveable_and_save(tmp_path: Path) -> None:
    assert jaxstow._names.registry.name_of(Counter) == "tests.Counter"
    with pytest.raises(TypeError, match="names twice"):
        jaxstow.saveable("tests.Twice", name="tests.Twice")
    counter = Counter(3)
    jaxstow.save(counter, tmp_path / "counter.jxs")  # FlareJax's order: the tree, then the path
    jaxstow.save(tmp_path / "kept.jxs", "a string tree")  # a path first is a path, whatever the second argument is
    loaded = jaxstow.load(tmp_path / "counter.jxs")
    assert type(loaded) is Counter and loaded.count == 3
    assert jaxstow.load(tmp_path / "kept.jxs") == "a string tree"


@jaxstow.saveable(name="tests.attributes.Scaler")
class _Scaler:
    def __init__(self) -> None:
        self.mean = np.zeros(3)


@jaxstow.saveable(name="tests.attributes.Masked")
class Masked(eqx.Module):
    weight: jnp.ndarray
    mask: np.ndarray = eqx.field(static=True)


def _scaler(**attributes) -> _Scaler:
    scaler = _Scaler()
    vars(scaler).update(attributes)
    return scaler


def test_an_array_where_only_static_data_goes_is_refused_saying_what_works(tmp_path: Path) -> None:
    # A PRNG key in a plain class's attribute was "neither data nor registered; register it with jaxstow.saveable".
    cases = [
        (Masked(jnp.ones(1), np.arange(3)), "mask"),
        ({"scaler": _Scaler()}, "scaler/mean"),
        (_scaler(mean=[jnp.ones(2)]), "mean/0"),
        (_scaler(mean={"k": jnp.ones(2, jnp.bfloat16)}), "mean/k"),
        (_scaler(mean=(1, (jnp.ones(2), "x"))), "mean/1/0"),
        (_scaler(key=jax.random.key(0)), "key"),
    ]
    for tree, path in cases:
        with pytest.raises(UnsaveableObjectError, match=r"only static data may go .* make it a pytree field") as caught:
            jaxstow.save(tmp_path / "m.jxs", tree)
        assert caught.value.path == path
        assert "saveable" not in str(caught.value) and "register_pytree_node_class" in str(caught.value)
    assert not (tmp_path / "m.jxs").exists()


@pytest.mark.parametrize("value", [__import__("decimal").Decimal("1.5"), __import__("datetime").date(2020, 1, 2)])
def test_a_registered_class_written_in_c_is_refused_at_save_not_saved_empty(tmp_path: Path, value) -> None:
    jaxstow.saveable(type(value), name=f"my_project.{type(value).__name__}")  # as the advice for an object says
    with pytest.raises(UnsaveableObjectError, match=r"leaf 'lr' .*no __dict__ and no __slots__: written in C"):
        jaxstow.save(tmp_path / "state.jxs", {"lr": value})  # it came back as Decimal('0'), or did not load
    assert not (tmp_path / "state.jxs").exists()


@dataclasses.dataclass
class HyperRenamed:  # the next version of the code: rate renamed
    width: int
    learning_rate: float


@dataclasses.dataclass
class HyperGrown:  # the next version of the code: a field added, with a default
    width: int
    rate: float
    learning_rate: float = 1e-3


@pytest.mark.parametrize("changed", [HyperRenamed, HyperGrown], ids=lambda cls: cls.__name__)
def test_a_dataclass_whose_fields_changed_since_the_save_is_refused_not_rebuilt_without_them(
    tmp_path: Path, changed: type
) -> None:
    @dataclasses.dataclass
    class Hyper:
        width: int
        rate: float

    jaxstow.saveable(Hyper, name="tests.Hyper")
    jaxstow.save(tmp_path / "model.jxs", {"hp": Hyper(3, 0.1), "w": jnp.ones(2)})
    with pytest.warns(UserWarning, match="now names"):
        jaxstow.saveable(changed, name="tests.Hyper")
    with pytest.raises(
        StructureMismatchError,
        match=r"model\.jxs does not fit .*\n  - 'hp': the dataclass tests\.Hyper has the fields \['width', .*"
        r"'learning_rate'\] now, the file holds the attributes \['rate', 'width'\]: \['learning_rate'\] would be "
        r"missing from the instance \(renamed or added since the save\?\)\nLoad the file with the class as it was saved",
    ):
        jaxstow.load(tmp_path / "model.jxs")
