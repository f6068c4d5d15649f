"""Enum members load back as the very members of their registered class; values are never turned into their base type."""

from __future__ import annotations

import enum
import functools
import json

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._format.skeleton import decode_value
from jaxstow.errors import FormatError, UnknownNameError, UnsaveableObjectError

SUFFIXES = ["model.jxs", "model.npz"]


@jaxstow.saveable(name="tests.enum_members.Mode")
class Mode(str, enum.Enum):  # noqa: UP042  (the str mixin, as code before StrEnum writes it)
    TRAIN = "train"
    EVAL = "eval"


@jaxstow.saveable(name="tests.enum_members.Color")
class Color(enum.Enum):
    RED = 1
    CRIMSON = 1  # an alias: saved as the member it stands for
    GREEN = 2


@jaxstow.saveable(name="tests.enum_members.Level")
class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@jaxstow.saveable(name="tests.enum_members.Permission")
class Permission(enum.IntFlag):
    READ = 1
    WRITE = 2


class Unregistered(enum.StrEnum):
    ON = "on"


class Unnamed(enum.IntEnum):
    ONE = 1


class Layer(eqx.Module):
    weight: jnp.ndarray
    mode: object = eqx.field(static=True)


@jaxstow.saveable(name="tests.enum_members.Width")
class Width(int):
    """An int subclass: its value is not among its attributes."""


@jaxstow.saveable(name="tests.enum_members.Wrapper")
class Wrapper:
    def __init__(self, function):
        functools.update_wrapper(self, function)


def _roundtrip(tmp_path, tree, suffix="model.jxs"):
    path = tmp_path / suffix
    jaxstow.save(path, tree)
    return jaxstow.load(path)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("member", [Mode.TRAIN, Color.GREEN, Color.CRIMSON, Level.HIGH, Permission.WRITE])
def test_a_member_of_a_registered_enum_loads_as_itself(tmp_path, suffix, member):
    loaded = _roundtrip(tmp_path, {"leaf": member, "layer": Layer(jnp.ones(2), member)}, suffix)
    assert loaded["leaf"] is member
    assert loaded["layer"].mode is member


def test_enum_members_as_dict_keys_and_inside_static_containers(tmp_path):
    tree = {"by_level": {Level.LOW: jnp.ones(1), Level.HIGH: jnp.zeros(1)}, "layer": Layer(jnp.ones(1), (Mode.EVAL,))}
    loaded = _roundtrip(tmp_path, tree)
    assert [type(key) for key in loaded["by_level"]] == [Level, Level]
    assert loaded["layer"].mode[0] is Mode.EVAL


def test_a_member_is_written_as_its_class_and_name_and_no_dunder_attribute(tmp_path):
    path = tmp_path / "model.jxs"
    jaxstow.save(path, {"c": Color.RED})
    header = path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")].decode()
    manifest = json.loads(json.loads(header)["__metadata__"]["jaxstow"])
    assert '{"enum": "tests.enum_members.Color", "member": "RED"}' in json.dumps(manifest)
    assert "__objclass__" not in header


@pytest.mark.parametrize("member", [Unregistered.ON, Unnamed.ONE])
def test_a_member_of_an_unregistered_enum_is_refused_at_save_naming_the_attribute(tmp_path, member):
    with pytest.raises(UnsaveableObjectError) as caught:
        jaxstow.save(tmp_path / "model.jxs", {"layer": Layer(jnp.ones(1), member)})
    cls = type(member)
    assert caught.value.path == "layer/mode"
    assert f"a member of the enum {cls.__module__}.{cls.__qualname__}, which is not registered" in str(caught.value)
    assert f"jaxstow.saveable({cls.__name__}, name=...)" in str(caught.value)
    assert not (tmp_path / "model.jxs").exists()


def test_a_combination_of_flags_is_refused_with_what_to_save_instead(tmp_path):
    with pytest.raises(UnsaveableObjectError, match=r"leaf 'p'.*a combination of the flags.*save its value, 3"):
        jaxstow.save(tmp_path / "model.jxs", {"p": Permission.READ | Permission.WRITE})


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        ({"enum": "tests.enum_members.Color", "member": "BLUE"}, FormatError, "has no member 'BLUE'"),
        ({"enum": "jax.nn.relu", "member": "RED"}, FormatError, "not an enum class"),
        ({"enum": "tests.enum_members.Color", "member": 1}, FormatError, "unreadable enum member"),
        ({"enum": "tests.enum_members.Color"}, FormatError, "unreadable enum member"),
        ({"enum": "tests.no_such.Enum", "member": "RED"}, UnknownNameError, "tests.no_such.Enum"),
    ],
)
def test_a_member_that_cannot_be_looked_up_is_refused_at_load(data, error, message):
    with pytest.raises(error, match=message) as caught:
        decode_value(data, path="c", file="model.jxs")
    assert caught.value.path == "c" and caught.value.file == "model.jxs"


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_numpy_string_loads_as_a_numpy_string_and_a_plain_string_as_a_string(tmp_path, suffix):
    static = (np.str_("gelu"), "train", 3, True, 0.5, None)
    loaded = _roundtrip(tmp_path, {"s": np.str_("relu"), "layer": Layer(jnp.ones(1), static)}, suffix)
    assert type(loaded["s"]) is np.str_ and loaded["s"] == "relu"
    assert loaded["layer"].mode == static
    assert [type(value) for value in loaded["layer"].mode] == [np.str_, str, int, bool, float, type(None)]


def test_a_registered_subclass_of_a_builtin_value_is_refused_not_saved_empty(tmp_path):
    with pytest.raises(UnsaveableObjectError, match=r"leaf 'width'.*a subclass of int .*keep a plain int\(...\)"):
        jaxstow.save(tmp_path / "model.jxs", {"width": Width(7)})


def test_a_dunder_attribute_is_refused_at_save_naming_it(tmp_path):
    with pytest.raises(UnsaveableObjectError, match=r"leaf 'act/__doc__'.*no dunder attributes") as caught:
        jaxstow.save(tmp_path / "model.jxs", {"act": Wrapper(np.tanh)})
    assert caught.value.path == "act/__doc__"
