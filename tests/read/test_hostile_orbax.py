"""orbax checkpoints and runs whose metadata a stranger changed so that orbax would crash, read one leaf as another,
lose leaves or steps, or take what is not its own: ``jaxstow.load(..., from_format="orbax")`` and ``jaxstow convert``
refuse each with a ``FormatError`` (or a ``PathError``) naming the file, before orbax or tensorstore acts on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import jaxstow
from jaxstow.errors import FormatError

ocp = pytest.importorskip("orbax.checkpoint")
tensorstore = pytest.importorskip("tensorstore")
from orbax_folders import convert, orbax_folder, orbax_run  # noqa: E402 - needs orbax

TREE = {
    "a": {"b": np.arange(4, dtype=np.float32)},
    "bf": np.full(2, 7.0, np.float32),
    "layers": [np.full(2, 5, np.int32), np.full(2, 9, np.int32)],
}


def _edit_zarray(folder, leaf, change, *, ocdbt):
    """Change the ``.zarray`` of ``leaf``: a file of the folder, or a key of its OCDBT database."""
    if not ocdbt:
        path = folder / leaf / ".zarray"
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
        return
    database = tensorstore.KvStore.open({"driver": "ocdbt", "base": f"file://{folder}/"}).result()
    key = f"{leaf}/.zarray".encode()
    database.write(key, json.dumps(change(json.loads(database.read(key).result().value))).encode()).result()


@pytest.mark.parametrize("ocdbt", [False, True], ids=["zarr-folders", "ocdbt"])
def test_chunks_claimed_far_larger_than_their_array_are_refused_before_tensorstore_allocates_one(tmp_path, ocdbt):
    folder = orbax_folder(tmp_path / "ckpt", {"w": np.ones((3, 4), np.float32)}, ocdbt=ocdbt)
    _edit_zarray(folder, "w", lambda zarray: {**zarray, "chunks": [10**9, 10**9]}, ocdbt=ocdbt)
    done = convert(folder, tmp_path / "out.jxs")  # a process of its own: tensorstore's allocation aborted it
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{folder / 'w' / '.zarray'}: claims chunks of shape [1000000000, 1000000000], larger than" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out.jxs").exists()


def test_strings_of_a_checkpoint_nested_deep_or_not_strings_are_refused_naming_the_file(tmp_path):
    folder = orbax_folder(tmp_path / "ckpt", {"name": "run-a", "w": np.ones(3, np.float32)})
    strings = folder / "_strings.json"
    assert json.loads(strings.read_text()) == {"name": "run-a"}
    strings.write_text('{"name": {"a": 1}}')  # came back as the string "{'a': 1}"
    with pytest.raises(FormatError, match=rf"leaf 'name' of {strings}: holds {{'a': 1}} for a string leaf"):
        jaxstow.load(folder, from_format="orbax")
    strings.write_text('{"name": ' + "[" * 100_000 + "]" * 100_000 + "}")  # tensorstore's parser crashed on it
    done = convert(folder, tmp_path / "out.jxs")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{strings}: orbax's metadata is not valid JSON (maximum recursion depth" in done.stderr


def _keys(keys):
    return [{"key": key, "key_type": 1 if key.lstrip("-").isdigit() else 2} for key in keys]


@pytest.mark.parametrize(
    ("old", "keys", "problem"),
    [
        ("('bf',)", ["a.b"], r"names two leaves, 'a/b' and 'a.b', that orbax reads from one place, 'a.b'"),
        ("('layers', '1')", ["layers", "0"], r"names the leaf 'layers/0' twice: orbax would keep one of them"),
        ("('layers', '1')", ["layers", "-1"], r"indexes a list by '-1', where orbax writes 0, 1, \.\.\."),
        ("('layers', '1')", ["layers", "5"], r"indexes the list 'layers' by \[0, 5\], not 0, 1, \.\.\. without a gap"),
        ("('bf',)", ["a"], r"holds a leaf 'a' and leaves inside it: orbax would keep only one of them"),
        ("('bf',)", ["b\ud800"], r"names the leaf 'b\\ud800', which holds a lone surrogate"),
    ],
    ids=["alias", "repeated", "negative-index", "index-past-the-end", "leaf-and-node", "lone-surrogate"],
)
@pytest.mark.parametrize("ocdbt", [False, True], ids=["zarr-folders", "ocdbt"])
def test_a_tree_metadata_that_would_lose_a_leaf_or_read_one_as_another_is_refused(tmp_path, ocdbt, old, keys, problem):
    folder = orbax_folder(tmp_path / "ckpt", TREE, ocdbt=ocdbt)
    path = folder / "_METADATA"
    metadata = json.loads(path.read_text())
    metadata["tree_metadata"][old]["key_metadata"] = _keys(keys)
    path.write_text(json.dumps(metadata))  # orbax loaded each without an error, a leaf lost or read twice, or asserted
    with pytest.raises(FormatError, match=rf" of {path}: {problem}"):
        jaxstow.load(folder, from_format="orbax")


def test_metadata_calling_an_array_a_scalar_or_a_folder_in_place_of_it_is_a_format_error(tmp_path):
    folder = orbax_folder(tmp_path / "ckpt", {"w": np.ones((3, 4), np.float32)})
    path = folder / "_METADATA"
    metadata = json.loads(path.read_text())
    metadata["tree_metadata"]["('w',)"]["value_metadata"]["value_type"] = "scalar"
    path.write_text(json.dumps(metadata))
    with pytest.raises(FormatError, match=r"leaf 'w' of .*: its metadata calls the leaf a scalar, and it holds an"):
        jaxstow.load(folder, from_format="orbax")
    path.unlink()
    path.mkdir()
    with pytest.raises(FormatError, match=rf"{path}: is a folder, where orbax keeps a JSON file"):
        jaxstow.load(folder, from_format="orbax")


def _steps_converted(done, dst):
    return sorted(os.listdir(dst)) if done.returncode == 0 else None


@pytest.mark.parametrize("damage", ["no-metadata", "unnamed-item", "link-out", "twice"])
def test_converting_a_run_never_leaves_out_a_step_orbax_lists_or_takes_one_from_elsewhere(tmp_path, damage):
    run = orbax_run(tmp_path / "run", [1, 2])
    step = run / "1"
    if damage == "no-metadata":
        (step / "_CHECKPOINT_METADATA").unlink()  # orbax lists the step still; it was left out
        expected = rf"{step}: is a step folder without its _CHECKPOINT_METADATA"
    elif damage == "unnamed-item":
        metadata = json.loads((step / "_CHECKPOINT_METADATA").read_text())
        del metadata["item_handlers"]["default"]  # the step was converted without its tree
        (step / "_CHECKPOINT_METADATA").write_text(json.dumps(metadata))
        expected = rf"{step}: holds the item 'default', which its _CHECKPOINT_METADATA does not name"
    elif damage == "link-out":
        elsewhere = orbax_run(tmp_path / "elsewhere", [5])
        os.symlink(elsewhere / "5", run / "5")  # converted as step 5
        expected = rf"{run / '5'}: is a link to {elsewhere / '5'}, outside the orbax folder"
    else:
        shutil.copytree(step, run / "001")  # orbax's step 1 twice
        expected = rf"{run}: holds step 1 twice, in the folders '001' and '1'"
    done = convert(run, tmp_path / "converted")
    assert done.returncode == 2, (damage, _steps_converted(done, tmp_path / "converted"), done.stderr[-2000:])
    assert __import__("re").search(expected, done.stderr), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "converted").exists()


def test_a_step_folder_whose_name_is_no_text_is_refused_naming_it(tmp_path):
    run = orbax_run(tmp_path / "run", [1, 2])
    shutil.copytree(os.fsencode(run / "2"), os.fsencode(run) + b"/x\xff_5")  # tensorstore raised a RuntimeError
    done = convert(run, tmp_path / "converted")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "x\\udcff_5: is a step folder whose name is no printable UTF-8 text" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    ("metrics", "note"),
    [
        (b'{"loss": ' + b"9" * 400 + b"}", "loss (too large for a float)"),
        (b'{"a/b": 1, "a": {"b": 2}}', "a/b (a name given twice)"),
        (b"[1, 2]", "the metrics, a list, not a JSON object"),
    ],
    ids=["huge-integer", "name-twice", "a-list"],
)
def test_metrics_that_are_no_numbers_of_their_own_names_are_noted_and_kept_whole(tmp_path, metrics, note):
    run = orbax_run(tmp_path / "run", [1])
    (run / "1" / "metrics" / "metrics").write_bytes(metrics)
    done = convert(run, tmp_path / "converted")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        f"note: step 1: metrics that are not numbers are left out (the step's metadata keeps them whole, as "
        f"orbax_metrics): {note}" in done.stderr
    )
    manager = jaxstow.CheckpointManager(tmp_path / "converted")
    assert manager.metrics(1) == {} and manager.metadata(1)["orbax_metrics"] == json.loads(metrics)


def test_a_metric_named_with_a_lone_surrogate_is_listed_as_its_escape(tmp_path):
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"w": np.ones(2)}, metrics={"\ud800": 1.0})
    done = subprocess.run(
        [sys.executable, "-m", "jaxstow", "ls", str(tmp_path / "run")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\\ud800=1" in done.stdout


def test_a_truncated_chunk_is_one_line_naming_it_without_the_tracebacks_of_reads_left_in_flight(tmp_path):
    run = tmp_path / "run"
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=False)
    with ocp.CheckpointManager(run, item_names=("state",), item_handlers={"state": handler}) as manager:
        tree = {f"leaf{i}": np.full((3, 4), i, np.float32) for i in range(10)}  # reads in flight when one fails
        manager.save(1, args=ocp.args.Composite(state=ocp.args.PyTreeSave(tree)))
        manager.wait_until_finished()
    (run / "1" / "state" / "leaf3" / "0.0").write_bytes(b"")
    for attempt in range(3):  # the stray reports came in most runs, each at its own moment
        done = convert(run, tmp_path / f"converted-{attempt}")
        assert done.returncode == 2, done.stderr[-2000:]
        assert f'Error reading local file "{run}/1/state/leaf3/0.0"' in done.stderr
        assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [("gone", "does not exist"), ("object-dtype", 'Unsupported zarr dtype: "|O"')],
)
def test_an_array_metadata_orbax_cannot_read_is_named_in_the_error(tmp_path, damage, reason):
    folder = orbax_folder(tmp_path / "ckpt", {"w": np.ones((3, 4), np.float32)})
    zarray = folder / "w" / ".zarray"
    if damage == "gone":
        zarray.unlink()
    else:
        zarray.write_text(json.dumps({**json.loads(zarray.read_text()), "dtype": "|O"}))
    with pytest.raises(FormatError, match="not an orbax checkpoint that orbax can restore") as raised:
        jaxstow.load(folder, from_format="orbax")  # it said only "it has no tree metadata"
    assert (
        str(zarray) in str(raised.value) and reason in str(raised.value) and "tensorstore_spec" not in str(raised.value)
    )
