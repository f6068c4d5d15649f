"""Tensor names a header cannot mean: one listed twice says two things of its tensor (a FormatError naming it, never
the last one read as the truth, as safetensors' own parser and a JSON object's last member would have it); one with a
lone surrogate, which UTF-8 cannot write (a FormatError, not a name that fails whatever prints it)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import jaxstow
from jaxstow.errors import FormatError


def _safetensors(path, header: str, data: bytes) -> None:
    text = header.encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_a_tensor_listed_twice_with_other_dtypes_is_refused_naming_it(tmp_path):
    path = tmp_path / "twice.safetensors"
    entry = '"dtype":"{}","shape":[4],"data_offsets":[0,16]'
    _safetensors(
        path,
        f'{{"w":{{{entry.format("F32")}}},"w":{{{entry.format("I32")}}}}}',
        np.arange(4.0, dtype=np.float32).tobytes(),
    )
    for load in (lambda: jaxstow.load(path), lambda: jaxstow.load(path, as_numpy=True), lambda: jaxstow.open(path)):
        with pytest.raises(FormatError, match="lists 'w' twice") as caught:
            load()
        assert caught.value.path == "w" and str(path) in str(caught.value)


def test_two_metadata_members_are_refused(tmp_path):
    path = tmp_path / "metadata.safetensors"
    header = '{"__metadata__":{"a":"1"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"a":"2"}}'
    _safetensors(path, header, np.zeros(1, np.float32).tobytes())
    with pytest.raises(FormatError, match="lists '__metadata__' twice"):
        jaxstow.load(path)


def test_a_metadata_key_given_twice_is_refused_naming_it_and_one_spelled_as_a_value_too_is_read(tmp_path):
    path = tmp_path / "metadata.safetensors"
    entry = '"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    _safetensors(path, f'{{{entry},"__metadata__":{{"format":"pt","lr":"0.1","lr":"0.001"}}}}', bytes(4))
    for load in (lambda: jaxstow.load(path), lambda: jaxstow.open(path)):  # the last value read as the truth before
        with pytest.raises(FormatError, match=f"{path}: the header's __metadata__ gives 'lr' twice: which is meant"):
            load()
    _safetensors(path, f'{{{entry},"__metadata__":{{"format":"lr","lr":"format"}}}}', bytes(4))
    with jaxstow.open(path) as reader:
        assert reader.metadata == {"format": "lr", "lr": "format"}


def test_metadata_that_spells_the_members_names_is_no_repetition(tmp_path):
    path = tmp_path / "spelled.safetensors"
    header = '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"note":"\\"data_offsets\\" and \\"__metadata__\\""}}'
    _safetensors(path, header, np.ones(1, np.float32).tobytes())
    np.testing.assert_array_equal(jaxstow.load(path, as_numpy=True)["w"], np.ones(1, np.float32))


def test_a_tensor_name_with_a_lone_surrogate_is_refused_and_the_cli_says_so_in_one_line(tmp_path):
    from forked_cli import jaxstow_command

    path = tmp_path / "surrogate.safetensors"
    _safetensors(path, '{"\\ud800x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4))
    with pytest.raises(FormatError, match="lone surrogate") as caught:
        jaxstow.load(path)
    assert caught.value.path == "\\ud800x"
    done = jaxstow_command("inspect", path)
    assert done.returncode == 2 and "lone surrogate" in done.stderr and "Traceback" not in done.stderr
    done = jaxstow_command("verify", path)  # a safetensors file that no reader reads: damaged, as a folder's shard
    assert done.returncode == 1 and done.stdout.startswith("DAMAGED  leaf ")
    assert f"of {path}: the tensor name holds a lone surrogate" in done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("header", "expected", "path"),
    [
        (
            '{"w":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}}',
            "an entry of the header gives 'dtype' twice",
            None,
        ),
        (
            '{"__metadata__":{"a":"1"},"__metadat\\u0061__":{"a":"2"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
            "lists '__metadata__' twice",
            "__metadata__",
        ),
        (
            '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"\\u0077":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}',
            "lists 'w' twice",
            "w",
        ),
        (
            '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"data_offsets":[0,4],"x":'
            + "[" * 1010
            + "]" * 1010
            + "}}",
            "nests too deep|gives 'data_offsets' twice",  # as deep as the standard library parses (3.13: deeper)
            None,
        ),
    ],
    ids=["within an entry", "escaped metadata", "escaped name", "deep"],
)
def test_repetitions_an_escape_or_an_entry_hides_are_refused_too(tmp_path, header, expected, path):
    file = tmp_path / "hidden.safetensors"
    _safetensors(file, header, np.ones(1, np.float32).tobytes())
    with pytest.raises(FormatError, match=expected) as caught:
        jaxstow.load(file)
    assert caught.value.path == path


def test_a_tensor_listed_twice_among_150000_is_refused_naming_it_at_once(tmp_path):
    """The repeated name is found in one pass over the header's members (each member was counted against all of
    them before: 150,000 tensors took hours)."""
    path = tmp_path / "many.safetensors"
    entries = [f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(150_000)]
    _safetensors(path, "{" + ",".join([*entries, entries[7]]) + "}", bytes(150_000))
    with pytest.raises(FormatError, match="lists 't7' twice") as caught:
        jaxstow.open(path)
    assert caught.value.path == "t7"
