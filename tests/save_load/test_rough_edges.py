"""What a new user runs into: folders given as files, missing folders, metadata that is not JSON, unsaveable objects."""

from __future__ import annotations

import os
import stat
import threading

import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow import CheckpointManager
from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow.errors import ArgumentError, JaxstowError, MetadataError, PathError, UnsaveableObjectError


def test_a_folder_given_to_load_is_named(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(PathError, match=f"^{tmp_path / 'plain'}: is a folder, not a file$"):
        jaxstow.load(tmp_path / "plain")
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(3, {"w": jnp.ones(2)})
    with pytest.raises(
        PathError, match=r"is a checkpoint folder, not a file: restore it with jaxstow\.CheckpointManager"
    ):
        jaxstow.load(tmp_path / "run")
    with pytest.raises(PathError, match=r"step 3 of a checkpoint folder.*CheckpointManager\('.*run'\)\.restore\(3\)"):
        jaxstow.load(tmp_path / "run" / "3")
    with pytest.raises(PathError, match="is a folder"):
        jaxstow.load_metadata(tmp_path / "plain")


def test_a_missing_folder_at_save_names_the_users_path(tmp_path):
    target = tmp_path / "no" / "such" / "model.jxs"
    with pytest.raises(PathError) as caught:
        jaxstow.save(target, {"w": jnp.ones(2)})
    assert (
        str(caught.value) == f"{target}: cannot write it: the folder {target.parent} does not exist (create it first)"
    )
    assert TEMPORARY_MARKER not in str(caught.value) and isinstance(caught.value, OSError)
    (tmp_path / "taken.jxs").mkdir()
    with pytest.raises(PathError, match=r"taken\.jxs: cannot write it: it is a folder"):
        jaxstow.save(tmp_path / "taken.jxs", {"w": jnp.ones(2)})
    assert os.listdir(tmp_path) == ["taken.jxs"]


@pytest.mark.parametrize("progress", ["no", "False", 0, None])
def test_a_progress_that_is_not_true_or_false_is_refused_before_anything_is_written(tmp_path, progress, capsys):
    # was: progress="no" drew a progress bar, as any truthy value did
    with pytest.raises(ArgumentError, match=f"progress= takes True or False, not {progress!r}"):
        jaxstow.save(tmp_path / "model.jxs", {"w": jnp.ones(2)}, progress=progress)
    assert os.listdir(tmp_path) == [] and capsys.readouterr().err == ""


def test_a_save_onto_a_pipe_or_device_leaves_it_alone(tmp_path):
    # The atomic rename put a regular file in place of the node (as root, `jaxstow convert x.jxs /dev/null` replaced
    # the machine's /dev/null).
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(
        PathError, match=r"pipe: cannot write it: it is a FIFO \(a named pipe\); jaxstow writes regular"
    ):
        jaxstow.save(pipe, {"w": jnp.ones(2)})
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and os.listdir(tmp_path) == ["pipe"]


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"loss": float("nan")}, "key 'loss': nan is not a JSON number"),
        ({"run": {"best": [1.0, float("inf")]}}, "key 'run/best/1': inf is not a JSON number"),
        (
            {"step": np.int64(7)},
            r"key 'step': np.int64\(7\) is a numpy int64, not a JSON value \(convert it with .item\(\)\)",
        ),
        ({"tags": {"a", "b"}}, "key 'tags': .* of type set is not a JSON value"),
        ({3: "three"}, "the key 3 is not a string"),
        (["not", "a", "dict"], "a dict, not list"),
    ],
)
def test_metadata_that_is_not_json_names_the_key(tmp_path, metadata, message):
    with pytest.raises(MetadataError, match=message) as caught:
        jaxstow.save(tmp_path / "m.jxs", {"w": jnp.ones(1)}, metadata=metadata)
    assert isinstance(caught.value, JaxstowError) and str(tmp_path / "m.jxs") in str(caught.value)
    assert not (tmp_path / "m.jxs").exists()
    with CheckpointManager(tmp_path / "run") as manager, pytest.raises(MetadataError, match=message):
        manager.save(1, {"w": jnp.ones(1)}, metadata=metadata)


def _generator():
    yield 1


@pytest.mark.parametrize(
    ("leaf", "advice"),
    [
        ({1, 2}, "a set, which has no order to save: save sorted"),
        (_generator(), "an iterator, whose values are not there to save: save list"),
        (iter([1, 2]), "an iterator"),
        (threading.Lock(), "a resource of this process"),
        (bytearray(b"ab"), "a mutable buffer: save bytes"),
        (range(3), "an object of builtins, which no file may name .*keep a plain value"),  # saveable refuses it
        (__import__("pathlib").Path("/x"), "an object of pathlib, which no file may name"),
    ],
)
def test_registering_is_advised_only_where_it_helps(tmp_path, leaf, advice):
    with pytest.raises(UnsaveableObjectError, match=advice) as caught:
        jaxstow.save(tmp_path / "x.jxs", {"leaf": leaf})
    assert "saveable" not in str(caught.value)


def test_an_open_file_is_not_to_be_registered(tmp_path):
    with open(tmp_path / "notes.txt", "w") as file, pytest.raises(UnsaveableObjectError) as caught:
        jaxstow.save(tmp_path / "x.jxs", {"log": file})
    assert "a resource of this process" in str(caught.value) and "saveable" not in str(caught.value)
    with pytest.raises(UnsaveableObjectError, match=r"register it with jaxstow\.saveable"):
        jaxstow.save(tmp_path / "x.jxs", {"act": lambda x: x})


def test_the_public_names_of_the_package():
    public = {"CheckpointManager", "io", "train", "objax", "save", "load", "open", "saveable", "errors", "Reader"}
    assert public <= set(jaxstow.__all__) and set(dir(jaxstow)) == {*jaxstow.__all__, "Checkpoint"}
    with pytest.warns(DeprecationWarning, match="jaxstow.objax.TreeCheckpoint"):
        assert jaxstow.Checkpoint is jaxstow.objax.TreeCheckpoint  # listed, and still there
    assert not [name for name in dir(jaxstow) if name.startswith("_") and name != "__version__"]
    for name in jaxstow.__all__:
        assert getattr(jaxstow, name) is not None


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (lambda: jaxstow.Checkpoint, lambda: jaxstow.objax.TreeCheckpoint),
        (lambda: jaxstow.checkpoint.Checkpoint, lambda: jaxstow.objax.TreeCheckpoint),
        (lambda: jaxstow.io.Checkpoint, lambda: jaxstow.io.ChainCheckpoint),
    ],
)
def test_moved_names_still_work_and_say_where_they_went(old, new):
    with pytest.warns(DeprecationWarning, match="has moved: use jaxstow"):
        assert old() is new()


@pytest.mark.parametrize("call", ["save", "load", "open", "manager"])
def test_a_path_holding_a_nul_character_is_an_argument_error_naming_it(tmp_path, call):
    # The system's "ValueError: embedded null byte", from the first os.stat of the path.
    path = str(tmp_path / "a\x00b.jxs")
    calls = {
        "save": lambda: jaxstow.save(path, {"w": np.ones(2)}),
        "load": lambda: jaxstow.load(path),
        "open": lambda: jaxstow.open(path),
        "manager": lambda: jaxstow.CheckpointManager(path).save(1, {"w": np.ones(2)}),
    }
    with pytest.raises(jaxstow.errors.ArgumentError, match=r"'.*a\\x00b.jxs' holds a NUL character"):
        calls[call]()
