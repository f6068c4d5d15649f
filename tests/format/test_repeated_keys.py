"""A structure that names a key twice (a dict's key, an object's attribute or field, a partial's keyword) is refused
where it is read: kept, the last value would silently win and the first, with any leaves under it, be lost. So is a
tagged value with a member its tag does not take."""

from __future__ import annotations

import numpy as np
import pytest

import jaxstow
from jaxstow._format.skeleton import decode_treedef, decode_value
from jaxstow._write.encoded import encode_tree
from jaxstow.errors import FormatError


def test_a_dict_of_the_tree_naming_a_key_twice_is_refused():
    with pytest.raises(FormatError, match="'a' is named twice"):
        decode_treedef({"dict": [["a", "*"], ["a", "*"]]})
    with pytest.raises(FormatError, match="'a' is named twice") as raised:
        decode_treedef({"dict": [["m", {"tuple": []}], ["n", {"dict": [["a", "*"], ["a", None]]}]]})
    assert " n: " in str(raised.value) or "'n'" in str(raised.value), str(raised.value)


@pytest.mark.parametrize(
    "value",
    [
        {"dict": [["lr", {"float": "0.1"}], ["lr", {"float": "0.001"}]]},
        {"partial": {"func": "functools.reduce", "args": [], "keywords": [["initial", 1], ["initial", 2]]}},
    ],
    ids=["dict", "partial keywords"],
)
def test_a_value_naming_a_key_twice_is_refused(value):
    with pytest.raises(FormatError, match="is named twice"):
        decode_value(value)


def test_a_file_whose_tree_names_a_key_twice_is_refused_by_load_and_open(tmp_path):
    """A file forged to pass its header checksum: the array under the first 'a' must not vanish from the load."""
    frozen = encode_tree({"a": np.arange(6.0).reshape(2, 3), "b": 3})
    assert frozen.manifest["structure"] == {"dict": [["a", "*"], ["b", "*"]]}
    frozen.manifest["structure"]["dict"][1][0] = "a"
    path = tmp_path / "forged.jxs"
    frozen.write(path)
    with pytest.raises(FormatError, match="'a' is named twice"):
        jaxstow.load(path)
    with pytest.raises(FormatError, match="'a' is named twice"), jaxstow.open(path) as reader:
        reader.load()


@pytest.mark.parametrize(
    "value", [{"float": "1.0", "list": [1]}, {"tuple": [1], "dict": []}, {"ref": "x", "attrs": []}]
)
def test_a_tagged_value_with_a_member_its_tag_does_not_take_is_refused(value):
    """Which of two readings was meant cannot be told: the first member's, or the other's."""
    with pytest.raises(FormatError, match="unreadable value"):
        decode_value(value)
