"""The Objax ``Checkpoint`` surface: its save/restore sequence, empty folders, missing indices, subclasses."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow.errors import CheckpointError
from jaxstow.objax import TreeCheckpoint as Checkpoint


def _tree(idx: int) -> dict:
    return {"linear": {"w": jnp.full((3, 2), float(idx)), "b": jnp.full(2, float(idx))}}


def test_objax_sequence(tmp_path):
    ckpt = Checkpoint(logdir=tmp_path, keep_ckpts=2)
    for idx in (1, 5, 3, 10, 7):
        ckpt.save(_tree(idx), idx=idx)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["0000000007.npz", "0000000010.npz"]
    tree, idx, path = ckpt.restore()
    assert idx == 10 and path == os.path.join(tmp_path, "ckpt", "0000000010.npz")
    np.testing.assert_array_equal(tree["linear"]["b"], np.full(2, 10.0))
    tree, idx, path = ckpt.restore(like=_tree(0), idx=7)
    assert idx == 7 and float(tree["linear"]["w"][0, 0]) == 7.0
    # The files are plain npz archives, as Objax writes them.
    with np.load(path, allow_pickle=False) as archive:
        assert "linear/w" in archive.files


def test_empty_folder_restores_nothing(tmp_path):
    initial = _tree(0)
    tree, idx, path = Checkpoint(tmp_path, keep_ckpts=3).restore(initial)
    assert (tree, idx, path) == (initial, 0, "")
    assert Checkpoint(tmp_path / "never", keep_ckpts=3, makedir=False).restore() == (None, 0, "")
    assert not os.path.exists(tmp_path / "never")


def test_missing_index_raises_file_not_found(tmp_path):
    ckpt = Checkpoint(tmp_path, keep_ckpts=3)
    ckpt.save(_tree(2), 2)
    with pytest.raises(
        FileNotFoundError, match=r"0000000004\.npz: no checkpoint 4 here \(its indices: \[2\]\)"
    ) as raised:
        ckpt.restore(idx=4)
    assert isinstance(raised.value, jaxstow.errors.PathNotFoundError)
    with pytest.raises(jaxstow.errors.ArgumentError, match=r"notes\.txt is not a checkpoint file name"):
        Checkpoint.checkpoint_idx("notes.txt")


def test_stray_files_are_ignored(tmp_path):
    ckpt = Checkpoint(tmp_path, keep_ckpts=1)
    folder = tmp_path / "ckpt"
    for stray in ("notes.txt", "best.npz", "12.npz", "00000000001.npz"):
        (folder / stray).write_text("not a checkpoint")
    (folder / "9999999999.npz.bak").write_text("neither")
    ckpt.save(_tree(3), 3)
    ckpt.save(_tree(4), 4)
    assert ckpt.indices() == [4]
    assert {"notes.txt", "best.npz", "12.npz", "00000000001.npz", "9999999999.npz.bak"} <= set(os.listdir(folder))
    assert ckpt.restore()[1] == 4


class NativeCheckpoint(Checkpoint):
    DIR_NAME = "weights"
    FILE_MATCH = "step-*.safetensors"
    FILE_FORMAT = "step-%06d.safetensors"


def test_subclass_overriding_names(tmp_path):
    ckpt = NativeCheckpoint(tmp_path, keep_ckpts=2)
    for idx in (1, 2, 3):
        ckpt.save(_tree(idx), idx)
    assert sorted(os.listdir(tmp_path / "weights")) == [
        "step-000002.safetensors",
        "step-000003.safetensors",
    ]
    tree, idx, path = ckpt.restore()
    assert idx == 3 and path.endswith("step-000003.safetensors")
    # A safetensors file with the jaxstow manifest: the tree comes back whole.
    assert jaxstow.load_metadata(path) is None and float(tree["linear"]["b"][0]) == 3.0


def test_a_subclass_overriding_file_format_alone_finds_and_prunes_its_files(tmp_path):
    class Stepped(Checkpoint):
        FILE_FORMAT = "step-%06d.jxs"  # FILE_MATCH left "*.npz": indices() was [] and restore() (None, 0, '')

    ckpt = Stepped(tmp_path, keep_ckpts=2)
    for idx in (1, 2, 3):
        ckpt.save(_tree(idx), idx)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step-000002.jxs", "step-000003.jxs"]
    assert ckpt.indices() == [2, 3] and Stepped(tmp_path, keep_ckpts=2).restore()[1] == 3


def test_a_file_format_naming_a_subfolder_is_refused_before_anything_is_saved(tmp_path):
    class Nested(Checkpoint):
        FILE_FORMAT = (
            "%05d/model.npz"  # saved once its folder was made by hand, then never found: restore() (None, 0, '')
        )

    with pytest.raises(ValueError, match=r"without a folder separator, not '%05d/model\.npz'.*DIR_NAME"):
        Nested(tmp_path, keep_ckpts=2)
    assert not (tmp_path / "ckpt").exists()


def test_subclass_overriding_save_and_load(tmp_path):
    calls = []

    def save_fn(path, tree):
        calls.append(("save", os.path.basename(path)))
        jaxstow.save(path, tree, metadata={"by": "save_fn"})

    def load_fn(path, like):
        calls.append(("load", os.path.basename(path)))
        return jaxstow.load_metadata(path)

    class Custom(Checkpoint):
        FILE_MATCH = "*.jxs"
        FILE_FORMAT = "%d.jxs"
        SAVE_FN = staticmethod(save_fn)
        LOAD_FN = staticmethod(load_fn)

    ckpt = Custom(tmp_path, keep_ckpts=5)
    ckpt.save(_tree(1), 8)
    assert ckpt.restore() == ({"by": "save_fn"}, 8, os.path.join(tmp_path, "ckpt", "8.jxs"))
    assert calls == [("save", "8.jxs"), ("load", "8.jxs")]


def test_two_checkpoints_of_one_folder_save_in_turn_and_a_writer_holding_its_lock_is_named(tmp_path):
    first = Checkpoint(tmp_path, keep_ckpts=2)
    first.save(_tree(1), 1)
    second = Checkpoint(tmp_path, keep_ckpts=2)  # a notebook cell run again: the first is still alive, as in Objax
    assert second.restore()[1] == 1
    second.save(_tree(2), 2)
    first.save(_tree(3), 3)
    assert second.indices() == [2, 3] and sorted(os.listdir(tmp_path / "ckpt")) == ["0000000002.npz", "0000000003.npz"]
    with jaxstow.CheckpointManager(tmp_path / "ckpt") as holder:  # another writer, holding the folder's lock
        holder.save(4, {"w": np.ones(2)})
        with pytest.raises(CheckpointError, match=r"ckpt is being written by another checkpoint manager \(process"):
            second.save(_tree(5), 5)


def test_leftovers_of_interrupted_saves_are_removed(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    leftover = folder / ".0000000003.npz.jaxstow-tmp-999-abcd"
    leftover.write_bytes(b"half a file")
    ckpt = Checkpoint(tmp_path, keep_ckpts=2)
    assert ckpt.indices() == []
    ckpt.save(_tree(4), 4)
    assert not leftover.exists() and ckpt.indices() == [4]


@pytest.mark.parametrize("keep", [0, -1, 2.5, "3", True])
def test_keep_ckpts_out_of_range_is_named_as_the_argument_given(tmp_path, keep):
    with pytest.raises(jaxstow.errors.ArgumentError, match=r"^keep_ckpts must be how many checkpoints to keep"):
        Checkpoint(tmp_path, keep_ckpts=keep)


@pytest.mark.parametrize("keep", [1, 2])
def test_a_save_that_higher_indices_of_another_run_would_delete_at_once_is_refused(tmp_path, keep):
    Checkpoint(tmp_path, keep_ckpts=3).save(_tree(50), 50)  # an earlier run in the same logdir
    Checkpoint(tmp_path, keep_ckpts=3).save(_tree(60), 60)
    ckpt = Checkpoint(tmp_path, keep_ckpts=keep)
    with pytest.raises(
        CheckpointError,
        match=r"0000000001\.npz: checkpoint 1 would be deleted as soon as it is saved, "
        r"and restore\(\) would take checkpoint 60 instead: .*holds the higher indices 50, 60.*Give this "
        r"run a logdir of its own",
    ):
        ckpt.save(_tree(1), 1)
    assert ckpt.indices() == [50, 60]
    assert ckpt.restore()[1] == 60
    ckpt.save(_tree(61), 61)  # an index above them is kept
    assert ckpt.indices() == [50, 60, 61][-keep:]


def test_objax_variables_are_not_saved_to_be_deleted_by_later_checkpoints(tmp_path):
    class Var:
        def __init__(self, value):
            self.value = value

        def assign(self, value, check=True):
            self.value = value

    jaxstow.objax.Checkpoint(tmp_path, keep_ckpts=1, verbose=False).save({"(Linear).w": Var(jnp.ones(2))}, 9)
    ckpt = jaxstow.objax.Checkpoint(tmp_path, keep_ckpts=1, verbose=False)
    with pytest.raises(CheckpointError, match=r"checkpoint 3 would be deleted as soon as it is saved"):
        ckpt.save({"(Linear).w": Var(jnp.zeros(2))}, 3)
    assert ckpt.indices() == [9]
