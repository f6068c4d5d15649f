"""FlareJax's argument order, ``save(tree, path)``: a name or URL second is the destination, whatever the tree has."""

from __future__ import annotations

import io
import os
import pathlib
import uuid

import equinox as eqx
import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow.errors import ArgumentError

CALLS: list[str] = []


class Memory(eqx.Module):
    """A model with a ``write`` method, as a memory-augmented network has."""

    cells: jnp.ndarray

    def write(self, value):
        CALLS.append("write")
        return self


class FlushedMemory(Memory):
    """A model that also has ``flush``: taken for a file object, it would have been written nothing."""

    def flush(self):
        CALLS.append("flush")


@pytest.mark.parametrize("model_type", [Memory, FlushedMemory])
@pytest.mark.parametrize("as_path", [str, pathlib.Path], ids=["str", "Path"])
def test_a_model_with_a_write_method_is_saved_to_the_path_after_it(tmp_path, model_type, as_path):
    CALLS.clear()
    path = tmp_path / "model.jxs"
    jaxstow.save(model_type(jnp.arange(3.0)), as_path(path), metadata={"step": 1})
    assert CALLS == []
    loaded = jaxstow.load(path)
    assert type(loaded) is model_type and loaded.cells.tolist() == [0.0, 1.0, 2.0]
    assert jaxstow.load_metadata(path) == {"step": 1}


def test_a_url_second_is_the_destination_and_a_file_object_first_stays_one():
    CALLS.clear()
    url = f"memory://flarejax-order-{uuid.uuid4().hex}/model.jxs"
    jaxstow.save(FlushedMemory(jnp.ones(2)), url)
    assert CALLS == []
    assert jaxstow.load(url).cells.tolist() == [1.0, 1.0]
    buffer = io.BytesIO()
    jaxstow.save(buffer, "model.jxs")  # a tree that is a string, saved into the file object
    buffer.seek(0)
    assert jaxstow.load(buffer) == "model.jxs"


def test_two_strings_whose_second_names_a_file_are_refused_writing_nothing(tmp_path: pathlib.Path) -> None:
    """``save("hello world", "vocab.jxs")``, FlareJax's order with a string as the tree, wrote ``"vocab.jxs"`` to a
    file named ``hello world``."""
    with pytest.raises(ArgumentError, match=r"save got two strings, 'hello world' and '.*vocab\.jxs'"):
        jaxstow.save("hello world", str(tmp_path / "vocab.jxs"))
    assert not list(tmp_path.iterdir()) and not os.path.exists("hello world")


def test_a_string_is_saved_where_a_path_says(tmp_path: pathlib.Path) -> None:
    jaxstow.save("hello world", tmp_path / "vocab.jxs")  # FlareJax's order
    jaxstow.save(tmp_path / "notes.jxs", "some text")
    jaxstow.save(str(tmp_path / "plain.jxs"), "plain")  # jaxstow's order: the first is no file name of a format
    assert [jaxstow.load(tmp_path / name) for name in ("vocab.jxs", "notes.jxs", "plain.jxs")] == [
        "hello world",
        "some text",
        "plain",
    ]
