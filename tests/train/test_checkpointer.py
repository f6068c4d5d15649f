"""DefaultCheckpointer: when it saves, what it names its files, what it resumes from, and what it refuses."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tmpfs import make_read_only, small_tmpfs

import jaxstow
from jaxstow.errors import CheckpointError, NotAFolderError, StorageError
from jaxstow.train import AbstractCheckpointer, Checkpoint, DefaultCheckpointer, DefaultCheckpointerArguments


def _args(folder: Path, **overrides: Any) -> DefaultCheckpointerArguments:
    return DefaultCheckpointerArguments(
        **{"save_dir": folder, "model_state_save_dir": folder, "load_dir": folder, **overrides}
    )


def _state(epoch: int) -> Checkpoint:
    return Checkpoint(
        module_interface_state={"w": np.full(2, epoch, np.float32)},
        trainer_state={"last_epoch": epoch},
        trainer_backend_state={"global_step": 10 * epoch},
    )


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"not a checkpoint")


@pytest.mark.parametrize("period", [2, np.int64(2)], ids=["int", "numpy-int"])
def test_period_2_saves_multiples_of_2_and_force_saves_any_index(tmp_path: Path, period: int) -> None:
    checkpointer = DefaultCheckpointer(_args(tmp_path, period=period))
    written = {epoch: checkpointer.save(_state(epoch), epoch) for epoch in range(5)}
    assert written == {
        epoch: str(tmp_path / f"checkpoint_{epoch}.jxs") if epoch % 2 == 0 else None for epoch in range(5)
    }
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_0.jxs", "checkpoint_2.jxs", "checkpoint_4.jxs"]
    assert checkpointer.save(_state(1), 1, force=True) == str(tmp_path / "checkpoint_1.jxs")
    assert jaxstow.load(tmp_path / "checkpoint_1.jxs").trainer_state == {"last_epoch": 1}


def test_checkpoint_false_saves_nothing_even_when_forced(tmp_path: Path) -> None:
    checkpointer = DefaultCheckpointer(_args(tmp_path / "run", checkpoint=False))
    assert checkpointer.save(_state(0), 0) is None
    assert checkpointer.save(_state(1), 1, force=True) is None
    assert checkpointer.save_model({"w": np.ones(2)}, 1) is None
    assert not (tmp_path / "run").exists()


def test_saving_an_index_twice_leaves_one_file_holding_the_second_state(tmp_path: Path) -> None:
    checkpointer = DefaultCheckpointer(_args(tmp_path))
    checkpointer.save(_state(3), 3)
    checkpointer.save(_state(4), 3, force=True)
    assert os.listdir(tmp_path) == ["checkpoint_3.jxs"]
    assert jaxstow.load(tmp_path / "checkpoint_3.jxs").trainer_state == {"last_epoch": 4}


def test_save_makes_its_folders_and_the_state_comes_back_whole(tmp_path: Path) -> None:
    args = _args(tmp_path / "checkpoints", model_state_save_dir=tmp_path / "models")
    checkpointer = DefaultCheckpointer(args)
    checkpointer.save(_state(2), 2)
    assert checkpointer.save_model({"w": np.ones(2)}, 2) == str(tmp_path / "models" / "checkpoint_model_2.jxs")
    loaded = checkpointer.load()
    assert isinstance(loaded, Checkpoint)
    assert loaded.trainer_state == {"last_epoch": 2} and loaded.trainer_backend_state == {"global_step": 20}
    np.testing.assert_array_equal(loaded.module_interface_state["w"], [2.0, 2.0])


def test_load_takes_the_largest_index_and_never_a_model_file_or_a_lookalike(tmp_path: Path) -> None:
    checkpointer = DefaultCheckpointer(_args(tmp_path, file_ext="pt"))
    for epoch in (2, 9, 10):
        checkpointer.save(_state(epoch), epoch)
    checkpointer.save_model({"w": np.ones(2)}, 50)
    _touch(tmp_path, "checkpoint_60.xpt", "checkpoint_61.pt.bak", "other_70.pt", "checkpoint_71pt", "checkpoint_x.pt")
    assert checkpointer.load().trainer_state == {"last_epoch": 10}


def test_load_filename_overrides_the_latest(tmp_path: Path) -> None:
    writer = DefaultCheckpointer(_args(tmp_path))
    for epoch in range(3):
        writer.save(_state(epoch), epoch)
    reader = DefaultCheckpointer(_args(tmp_path, load_filename="checkpoint_1.jxs"))
    assert reader.load().trainer_state == {"last_epoch": 1}


@pytest.mark.parametrize("load_dir", ["empty", "missing", None])
def test_empty_missing_and_unconfigured_load_dirs_give_an_empty_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, load_dir: str | None
) -> None:
    (tmp_path / "empty").mkdir()
    _touch(tmp_path / "empty", "checkpoint_model_3.jxs", "notes.txt")
    checkpointer = DefaultCheckpointer(_args(tmp_path, load_dir=None if load_dir is None else tmp_path / load_dir))
    with caplog.at_level(logging.INFO, logger="jaxstow.train"):
        assert checkpointer.load() == Checkpoint()
    assert "starting from scratch" in caplog.text


def test_a_missing_load_filename_and_a_model_file_are_errors_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"checkpoint_7\.jxs"):
        DefaultCheckpointer(_args(tmp_path, load_filename="checkpoint_7.jxs")).load()
    DefaultCheckpointer(_args(tmp_path)).save_model({"w": np.ones(2)}, 4)
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint_model_4\.jxs holds a dict with the keys \['w'\], not a jaxstow\.train\.Checkpoint or a dict "
        r"of its fields",
    ):
        DefaultCheckpointer(_args(tmp_path, load_filename="checkpoint_model_4.jxs")).load()


def test_a_file_holding_the_dict_of_a_checkpoints_fields_resumes_like_a_checkpoint(tmp_path: Path) -> None:
    jaxstow.save(tmp_path / "checkpoint_7.jxs", vars(_state(7)))
    jaxstow.save(tmp_path / "checkpoint_8.jxs", {"trainer_state": {"last_epoch": 8}})
    loaded = DefaultCheckpointer(_args(tmp_path, load_filename="checkpoint_7.jxs")).load()
    assert isinstance(loaded, Checkpoint)
    assert loaded.trainer_state == {"last_epoch": 7} and loaded.trainer_backend_state == {"global_step": 70}
    np.testing.assert_array_equal(loaded.module_interface_state["w"], [7.0, 7.0])
    assert DefaultCheckpointer(_args(tmp_path)).load() == Checkpoint(trainer_state={"last_epoch": 8})
    jaxstow.save(tmp_path / "checkpoint_9.jxs", {"trainer_state": {"last_epoch": 9}, "epoch": 9})
    with pytest.raises(
        CheckpointError, match=r"checkpoint_9\.jxs holds a dict with the keys \['epoch', 'trainer_state'\]"
    ):
        DefaultCheckpointer(_args(tmp_path)).load()


@pytest.mark.parametrize(
    ("state", "found"),
    [(None, "NoneType"), ({"w": np.ones(2)}, r"a dict with the keys \['w'\]")],
    ids=["none", "module-state"],
)
def test_a_state_load_cannot_resume_from_is_refused_by_save_and_the_run_resumes_from_the_last_good_one(
    tmp_path: Path, state: Any, found: str
) -> None:
    checkpointer = DefaultCheckpointer(_args(tmp_path))
    checkpointer.save(_state(1), 1)
    with pytest.raises(
        jaxstow.errors.ArgumentError,
        match=rf"checkpoint_2\.jxs: save\(\) keeps a jaxstow\.train\.Checkpoint \(or a dict of its fields\), not {found}, "
        r"which load\(\) could not resume from: save Checkpoint\(module_interface_state=\.\.\.\)",
    ):
        checkpointer.save(state, 2, force=True)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_1.jxs"]
    assert DefaultCheckpointer(_args(tmp_path)).load().trainer_state == {"last_epoch": 1}


def test_a_damaged_newest_checkpoint_is_refused_saying_how_to_resume_from_the_one_before(tmp_path: Path) -> None:
    checkpointer = DefaultCheckpointer(_args(tmp_path))
    for epoch in range(3):
        checkpointer.save(_state(epoch), epoch)
    newest = tmp_path / "checkpoint_2.jxs"
    newest.write_bytes(newest.read_bytes()[:-100])  # cut short by a copy that failed
    with pytest.raises(jaxstow.errors.JaxstowError, match=r"checkpoint_2\.jxs") as raised:
        DefaultCheckpointer(_args(tmp_path)).load()
    assert "move it aside" in " ".join(raised.value.__notes__) and "load_filename" in raised.value.__notes__[0]
    resumed = DefaultCheckpointer(_args(tmp_path, load_filename="checkpoint_1.jxs")).load()
    assert resumed.trainer_state == {"last_epoch": 1}


def test_get_latest_file_gives_the_largest_index_or_nothing(tmp_path: Path) -> None:
    _touch(tmp_path, "run_3.pt", "run_12.pt", "run_model_40.pt", "run_50.pt.bak")
    assert DefaultCheckpointer.get_latest_file(tmp_path, "run", "pt") == str(tmp_path / "run_12.pt")
    assert DefaultCheckpointer.get_latest_file(tmp_path, "other", "pt") == ""
    assert DefaultCheckpointer.get_latest_file(tmp_path / "missing", "run") == ""


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"period": 0}, "period must be a positive integer, not 0"),
        ({"period": -2}, "period must be a positive integer, not -2"),
        ({"log_level": "LOUD"}, "log_level must be one of"),
        ({"log_level": True}, "log_level must be one of"),
        ({"load_dir": None, "load_filename": "checkpoint_1.jxs"}, "needs load_dir"),
        ({"delete_existing_checkpoints": True}, "would delete the checkpoints"),
        ({"file_prefix": "run1/ckpt"}, r"file_prefix must be a non-empty name without a folder separator"),
        ({"file_prefix": None}, r"file_prefix must be a non-empty name"),
        ({"file_ext": ""}, r"file_ext must be a non-empty name"),
        ({"save_dir": ""}, r"save_dir must be a folder \(str or os.PathLike\), not ''"),
        ({"save_dir": None}, r"save_dir must be a folder"),
        ({"load_dir": 5}, r"load_dir must be a folder \(str or os.PathLike\), or None, not 5"),
        ({"model_state_save_dir": ["a"]}, r"model_state_save_dir must be a folder"),
        ({"load_filename": 7}, r"load_filename must be a file name in load_dir, not 7"),
    ],
)
def test_unworkable_arguments_are_refused_at_construction(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    _touch(tmp_path, "checkpoint_1.jxs")
    with pytest.raises(ValueError, match=message):
        DefaultCheckpointer(_args(tmp_path, **overrides))
    assert os.listdir(tmp_path) == ["checkpoint_1.jxs"]


@pytest.mark.parametrize("level", [logging.DEBUG, "warning"])
def test_a_log_level_is_a_name_or_one_of_loggings_numbers(tmp_path: Path, level: int | str) -> None:
    checkpointer = DefaultCheckpointer(_args(tmp_path, log_level=level))
    assert checkpointer.logger.level == (level if isinstance(level, int) else logging.WARNING)


def test_a_log_level_is_the_checkpointers_own_and_its_records_reach_the_usual_handlers(tmp_path: Path, caplog) -> None:
    class Mine(AbstractCheckpointer):
        def save(self, checkpoint_state, index, force=False):
            pass

        def load(self):
            self.logger.warning("mine: no checkpoint loaded")
            return Checkpoint()

    quiet = DefaultCheckpointer(_args(tmp_path, log_level="ERROR", load_dir=tmp_path / "nothing"))
    loud = DefaultCheckpointer(_args(tmp_path, log_level="INFO", load_dir=tmp_path / "nothing"))
    with caplog.at_level(logging.INFO, logger="jaxstow"):
        Mine().load()
        quiet.load()
        loud.load()
    messages = [record.getMessage() for record in caplog.records]  # the quiet one's warning is not among them
    assert len(messages) == 2 and messages[0] == "mine: no checkpoint loaded", messages
    assert messages[1].startswith("no checkpoint checkpoint_<index>.jxs in ") and messages[1].endswith("from scratch")


def test_delete_existing_checkpoints_deletes_only_this_checkpointers_files(tmp_path: Path) -> None:
    saves, models = tmp_path / "saves", tmp_path / "models"
    strangers = ["other_1.jxs", "checkpoint_1.npz", "checkpoint_1.jxs.bak", "notes.txt", "checkpoint_best.jxs"]
    _touch(saves, "checkpoint_0.jxs", "checkpoint_12.jxs", *strangers)
    _touch(models, "checkpoint_model_12.jxs", *strangers)
    DefaultCheckpointer(_args(saves, model_state_save_dir=models, load_dir=None, delete_existing_checkpoints=True))
    assert sorted(os.listdir(saves)) == sorted(strangers)
    assert sorted(os.listdir(models)) == sorted(strangers)


def test_checkpointers_of_several_ranks_delete_their_files_at_once(tmp_path: Path) -> None:
    saves = tmp_path / "saves"
    _touch(saves, *(f"checkpoint_{index}.jxs" for index in range(2000)))
    started, failures = threading.Barrier(2), []

    def make() -> None:
        started.wait()
        try:
            DefaultCheckpointer(_args(saves, load_dir=None, delete_existing_checkpoints=True))
        except BaseException as error:  # a file the other deleted first is deleted, not an error
            failures.append(error)

    ranks = [threading.Thread(target=make) for _ in range(2)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join()
    assert failures == [] and os.listdir(saves) == []


def test_delete_existing_checkpoints_refuses_to_delete_the_load_filename_it_resumes_from(tmp_path: Path) -> None:
    saves = tmp_path / "saves"
    path = DefaultCheckpointer(_args(saves)).save(_state(7), 7)
    args = _args(saves, load_dir=tmp_path, load_filename="saves/checkpoint_7.jxs", delete_existing_checkpoints=True)
    with pytest.raises(ValueError, match=r"would delete .*saves/checkpoint_7\.jxs, the load_filename to resume from"):
        DefaultCheckpointer(args)
    assert path is not None and os.path.exists(path)


def test_npz_extension_writes_numpy_archives(tmp_path: Path) -> None:
    DefaultCheckpointer(_args(tmp_path, file_ext="npz")).save(_state(1), 1)
    with np.load(tmp_path / "checkpoint_1.npz", allow_pickle=False) as archive:
        np.testing.assert_array_equal(archive["module_interface_state/w"], [1.0, 1.0])
    assert DefaultCheckpointer(_args(tmp_path, file_ext="npz")).load().trainer_state == {"last_epoch": 1}


def test_default_folders_follow_the_working_directory_when_the_arguments_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        args = DefaultCheckpointerArguments()
        assert args.save_dir == args.model_state_save_dir == str(tmp_path / name / "checkpoints")


def test_a_save_dir_that_cannot_be_made_is_a_jaxstow_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    for save_dir, error, message in [
        (tmp_path / "afile", NotAFolderError, "is a file, not a folder"),
        (tmp_path / "afile" / "sub", NotAFolderError, "a part of its path is a file"),
    ]:
        with pytest.raises(error, match=message) as raised:
            DefaultCheckpointer(_args(tmp_path, save_dir=save_dir)).save(_state(0), 0)
        assert raised.value.file == str(save_dir)
    with small_tmpfs(tmp_path / "small") as disk:
        make_read_only(disk)
        with pytest.raises(StorageError, match="cannot make the folder") as raised:
            DefaultCheckpointer(_args(tmp_path, save_dir=disk / "checkpoints")).save(_state(0), 0)
        assert raised.value.file == str(disk / "checkpoints")


def test_relative_folders_stay_those_of_the_working_directory_the_checkpointer_was_made_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    DefaultCheckpointer(_args(theirs / "ckpt")).save(_state(9), 9)  # another run's folder, of the same relative name
    ours.mkdir()
    monkeypatch.chdir(ours)
    checkpointer = DefaultCheckpointer(_args(Path("ckpt")))
    checkpointer.save(_state(1), 1)
    monkeypatch.chdir(theirs)  # a notebook's %cd, a library that changes the working directory
    assert checkpointer.save(_state(2), 2) == str(ours / "ckpt" / "checkpoint_2.jxs")
    assert checkpointer.save_model({"w": np.ones(2)}, 2) == str(ours / "ckpt" / "checkpoint_model_2.jxs")
    assert checkpointer.load().trainer_state == {"last_epoch": 2}
    assert checkpointer.resumed_from == str(ours / "ckpt" / "checkpoint_2.jxs")
    assert sorted(os.listdir(theirs / "ckpt")) == ["checkpoint_9.jxs"]
