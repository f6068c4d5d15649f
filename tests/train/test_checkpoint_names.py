"""DefaultCheckpointer takes only the names it writes: an index in non-ASCII digits or zero-padded is no checkpoint of
it, so it never resumes from another tool's file and each index has one file, whatever order the folder lists them in."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

import jaxstow
from jaxstow.errors import ArgumentError
from jaxstow.train import Checkpoint, DefaultCheckpointer, DefaultCheckpointerArguments
from jaxstow.train.files import FileNames


def _args(folder: Path, **overrides: object) -> DefaultCheckpointerArguments:
    return DefaultCheckpointerArguments(
        **{"save_dir": folder, "model_state_save_dir": folder, "load_dir": folder, **overrides}
    )


def _state(epoch: int) -> Checkpoint:
    return Checkpoint(module_interface_state={"w": np.full(2, float(epoch))}, trainer_state={"last_epoch": epoch})


def test_an_index_in_other_digits_is_never_resumed_from(tmp_path: Path) -> None:
    checkpointer = DefaultCheckpointer(_args(tmp_path))
    for epoch in range(3):
        checkpointer.save(_state(epoch), epoch)
    for digits in ("\u0661\u0660\u0660", "\uff11\uff10\uff10", "\u0967\u0966\u0966"):  # 100 in Arabic-Indic, ...
        jaxstow.save(tmp_path / f"checkpoint_{digits}.jxs", _state(100))
    assert DefaultCheckpointer.get_latest_file(tmp_path, "checkpoint", "jxs") == str(tmp_path / "checkpoint_2.jxs")
    assert DefaultCheckpointer(_args(tmp_path)).load().trainer_state == {"last_epoch": 2}
    assert sorted(FileNames("checkpoint", "jxs").find(tmp_path)) == [0, 1, 2]


def test_a_padded_index_is_not_the_checkpoint_of_that_index(tmp_path: Path) -> None:
    checkpointer = DefaultCheckpointer(_args(tmp_path))
    checkpointer.save(_state(2), 2)
    for name in ("checkpoint_02.jxs", "checkpoint_002.jxs", "checkpoint_+3.jxs", "checkpoint_-0.jxs"):
        jaxstow.save(tmp_path / name, _state(99))
    found = FileNames("checkpoint", "jxs").find(tmp_path)
    assert found == {2: os.path.join(tmp_path, "checkpoint_2.jxs")}
    assert DefaultCheckpointer(_args(tmp_path)).load().trainer_state == {"last_epoch": 2}
    DefaultCheckpointer(_args(tmp_path, load_dir=None, delete_existing_checkpoints=True))  # only the files it wrote
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["checkpoint_02.jxs", "checkpoint_002.jxs", "checkpoint_+3.jxs", "checkpoint_-0.jxs"]
    )


def test_a_period_that_is_a_bool_and_an_extension_written_with_its_dot_are_refused(tmp_path: Path) -> None:
    import pytest

    from jaxstow.errors import ArgumentError

    with pytest.raises(ArgumentError, match="period must be a positive integer, not True"):
        DefaultCheckpointer(DefaultCheckpointerArguments(save_dir=tmp_path, period=True))
    with pytest.raises(ArgumentError, match=r"file_ext is the extension without its dot \('jxs'\), not '\.jxs'"):
        DefaultCheckpointer(DefaultCheckpointerArguments(save_dir=tmp_path, file_ext=".jxs"))


@pytest.mark.parametrize("flag", ["checkpoint", "delete_existing_checkpoints"])
def test_a_flag_given_as_text_is_refused_before_anything_is_deleted(tmp_path: Path, flag: str) -> None:
    old = DefaultCheckpointer(DefaultCheckpointerArguments(save_dir=tmp_path))
    old.save(Checkpoint(trainer_state={"last_epoch": 0}), 0)
    with pytest.raises(
        ArgumentError, match=rf"DefaultCheckpointerArguments\.{flag} must be True or False, not 'false'"
    ):
        DefaultCheckpointer(
            DefaultCheckpointerArguments(save_dir=tmp_path, load_dir=tmp_path / "other", **{flag: "false"})
        )
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_0.jxs"]  # "false" from a config file deleted them all
    with pytest.raises(ArgumentError, match=r"save's force must be True or False, not 'no'"):
        old.save(Checkpoint(), 1, force="no")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("checkpoint", "false", "checkpoint must be True or False"),
        ("period", 0, "period must be a positive integer"),
        ("file_ext", ".pt", "file_ext is the extension without its dot"),
        ("save_dir", None, "save_dir must be a folder"),
    ],
)
def test_arguments_set_after_the_checkpointer_is_made_are_checked_by_each_save(
    tmp_path: Path, field: str, value: object, expected: str
) -> None:
    checkpointer = DefaultCheckpointer(DefaultCheckpointerArguments(save_dir=tmp_path))
    setattr(checkpointer.args, field, value)  # as a trainer sets checkpointer.args.checkpoint = True
    with pytest.raises(ArgumentError, match=expected):  # "false" wrote the file; 0 was a ZeroDivisionError
        checkpointer.save(Checkpoint(trainer_state={"last_epoch": 0}), 2)
    assert os.listdir(tmp_path) == []


def test_a_load_filename_set_after_the_checkpointer_is_made_is_checked_by_load(tmp_path: Path) -> None:
    checkpointer = DefaultCheckpointer(DefaultCheckpointerArguments(save_dir=tmp_path, load_dir=tmp_path))
    checkpointer.args.load_filename = 5  # type: ignore[assignment]
    with pytest.raises(ArgumentError, match="load_filename must be a file name in load_dir, not 5"):
        checkpointer.load()  # was Python's TypeError of os.path.join


def test_a_load_dir_that_is_a_checkpoint_file_is_refused_not_started_from_scratch(tmp_path: Path) -> None:
    old = DefaultCheckpointer(DefaultCheckpointerArguments(save_dir=tmp_path))
    path = old.save(Checkpoint(trainer_state={"last_epoch": 2}), 2)
    with pytest.raises(ArgumentError, match=r"load_dir is the folder of the checkpoints, not the file .*checkpoint_2"):
        DefaultCheckpointer(DefaultCheckpointerArguments(save_dir=tmp_path / "new", load_dir=path))


@pytest.mark.parametrize("prefix", ["checkpoint_model", "checkpoint_Model"])
def test_a_prefix_whose_checkpoints_another_prefix_s_model_files_name_is_refused(tmp_path: Path, prefix: str) -> None:
    # "checkpoint_model_7.jxs" is checkpoint 7 of "checkpoint_model" and model file 7 of "checkpoint": the first
    # resumed from the second's model file, replaced it with its own save, and deleted it with
    # delete_existing_checkpoints; the second's delete_existing_checkpoints deleted the first's checkpoints.
    first = DefaultCheckpointer(_args(tmp_path))
    first.save(_state(1), 1)
    first.save_model({"w": np.full(2, 7.0)}, 7)
    fix = (
        rf"file_prefix '{prefix}' ends in '_model', so its checkpoints \({prefix}_<index>\.jxs\) are named as the "
        r"model files of the prefix 'checkpoint' .* Choose a prefix that does not end in '_model', such as "
        r"'checkpoint-model'"
    )
    with pytest.raises(ArgumentError, match=fix):
        DefaultCheckpointer(_args(tmp_path, file_prefix=prefix, delete_existing_checkpoints=True, load_dir=None))
    with pytest.raises(ArgumentError, match=fix):
        DefaultCheckpointer.get_latest_file(tmp_path, prefix, "jxs")  # was the model file checkpoint_model_7.jxs
    second = DefaultCheckpointer(_args(tmp_path, file_prefix="checkpoint-model"))
    second.args.file_prefix = prefix  # as a trainer may set it once the checkpointer is made
    with pytest.raises(ArgumentError, match=fix):
        second.save(_state(7), 7)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_1.jxs", "checkpoint_model_7.jxs"]
    assert jaxstow.load(tmp_path / "checkpoint_model_7.jxs", as_numpy=True)["w"].tolist() == [7.0, 7.0]
    assert DefaultCheckpointer(_args(tmp_path)).load().trainer_state == {"last_epoch": 1}


def test_a_name_of_a_checkpoint_that_is_no_file_is_left_out_with_a_warning(tmp_path, caplog):
    # A broken link as the newest checkpoint: the checkpointer resumed from the one before without a word.
    arguments = DefaultCheckpointerArguments(save_dir=tmp_path, model_state_save_dir=None, load_dir=tmp_path)
    DefaultCheckpointer(arguments).save(Checkpoint(trainer_state={"last_epoch": 1}), 1)
    (tmp_path / "checkpoint_5.jxs").symlink_to(tmp_path / "gone.jxs")
    with caplog.at_level(logging.WARNING):
        checkpointer = DefaultCheckpointer(arguments)
        assert checkpointer.load().trainer_state["last_epoch"] == 1
    assert f"{tmp_path / 'checkpoint_5.jxs'} is named as a checkpointer's file but is no file" in caplog.text
