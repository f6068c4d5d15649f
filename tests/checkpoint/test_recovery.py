"""Recovery that agrees with ``jaxstow verify``: a byte flipped anywhere in the newest step (its record, an item file's
header, the data of any leaf) is found by ``damaged_steps`` and ``latest_intact_step``, and the recovery recipe lands
on the step before it, every time."""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct

import numpy as np
import pytest

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.cli import main
from jaxstow.errors import CheckpointError, CorruptFileError

STEPS = (1, 2, 3)


def _state(step: int) -> dict:
    return {
        "params": {"w": np.full((64, 8), step, np.float32), "b": np.arange(8, dtype=np.int64) + step},
        "opt": {"mu": np.full(100, step / 10, np.float64)},
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Steps 1, 2 and 3 of a run with two items."""
    folder = tmp_path_factory.mktemp("recovery") / "run"
    with CheckpointManager(folder) as manager:
        for step in STEPS:
            manager.save(step, _state(step), metrics={"loss": 1 / step})
    return folder


def _tensor_ranges(path) -> list[tuple[int, int]]:
    """The byte range of every tensor of a safetensors file."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    return [
        (8 + length + start, 8 + length + stop)
        for name, info in header.items()
        if name != "__metadata__"
        for start, stop in [info["data_offsets"]]
    ]


def _places(folder) -> list[tuple[str, int]]:
    """Where to flip a byte in step 3: every byte of its record, the length and a spread of each header's bytes, and
    a spread of every tensor's bytes and its last."""
    step = folder / "3"
    places = [("checkpoint.json", offset) for offset in range((step / "checkpoint.json").stat().st_size)]
    for name in ("params.safetensors", "opt.safetensors"):
        (length,) = struct.unpack("<Q", (step / name).read_bytes()[:8])
        places += [(name, offset) for offset in [*range(8), *range(8, 8 + length, 97), 8 + length - 1]]
        places += [
            (name, offset)
            for start, stop in _tensor_ranges(step / name)
            for offset in (*range(start, stop, 61), stop - 1)
        ]
    return places


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << (offset % 8)
    path.write_bytes(bytes(data))


def _check_restored(tree, step: int) -> None:
    expected = _state(step)
    for item, leaves in expected.items():
        for name, value in leaves.items():
            np.testing.assert_array_equal(tree[item][name], value)


def test_every_flip_in_the_newest_step_lands_the_recipe_on_the_step_before(saved, tmp_path, caplog):
    places = _places(saved)
    assert len(places) > 300
    kinds = {"record": 0, "header": 0, "data": 0}
    for file, offset in places:
        run = tmp_path / f"{file}-{offset}"
        shutil.copytree(saved, run)
        _flip(run / "3" / file, offset)
        manager = CheckpointManager(run)
        damaged = manager.damaged_steps()
        assert list(damaged) == [3], (file, offset, damaged)
        assert manager.latest_intact_step() == 2, (file, offset)
        _check_restored(manager.restore(manager.latest_intact_step(), as_numpy=True), 2)
        with caplog.at_level(logging.WARNING, logger="jaxstow"):
            caplog.clear()
            _check_restored(manager.restore(fallback=True, as_numpy=True), 2)
        assert manager.restored is not None and manager.restored.step == 2 and list(manager.restored.skipped) == [3]
        assert f"step 3 is damaged, skipped: {manager.restored.skipped[3]}" in caplog.text
        kind = (
            "record"
            if file == "checkpoint.json"
            else "data"
            if offset >= _tensor_ranges(saved / "3" / file)[0][0]
            else "header"
        )
        kinds[kind] += 1
        if kind == "data":  # headers alone cannot see it; the data check and jaxstow verify both do
            assert manager.damaged_steps(verify="headers") == {}
            assert "checksum mismatch" in damaged[3]
        shutil.rmtree(run)
    assert min(kinds.values()) >= 18, kinds


def test_jaxstow_verify_agrees_with_the_manager(saved, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    start, _ = _tensor_ranges(run / "3" / "opt.safetensors")[0]
    _flip(run / "3" / "opt.safetensors", start + 5)
    assert main(["verify", str(run)]) != 0
    out = capsys.readouterr().out
    damaged = CheckpointManager(run).damaged_steps()
    assert list(damaged) == [3] and f"DAMAGED  {damaged[3]}" in out


def test_the_newest_intact_step_is_found_without_reading_older_steps(saved, tmp_path, caplog):
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    _flip(run / "1" / "params.safetensors", _tensor_ranges(run / "1" / "params.safetensors")[0][0])
    manager = CheckpointManager(run)
    with caplog.at_level(logging.INFO, logger="jaxstow"):
        assert manager.latest_intact_step() == 3
    assert "every leaf of step 3" in caplog.text and "step 2" not in caplog.text
    assert list(manager.damaged_steps()) == [1]
    assert manager.restore(fallback=True, as_numpy=True)["opt"]["mu"][0] == 0.3 and manager.restored.skipped == {}


def test_fallback_starts_at_the_step_asked_for_and_fails_when_nothing_is_intact(saved, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    for step in STEPS:
        _flip(run / str(step) / "params.safetensors", _tensor_ranges(run / str(step) / "params.safetensors")[-1][0])
    manager = CheckpointManager(run)
    with pytest.raises(CorruptFileError):
        manager.restore(2)
    with pytest.raises(
        CheckpointError, match=r"holds no step that restores intact \(step 2: leaf .* checksum mismatch"
    ):
        manager.restore(2, fallback=True)
    assert manager.latest_intact_step() is None and sorted(manager.damaged_steps()) == [1, 2, 3]


def test_a_damaged_step_asked_for_is_said_to_be_damaged_with_what_to_restore_instead(saved, tmp_path):
    # The error was the file's alone ("leaf 'w' of .../params.safetensors: checksum mismatch"): no word that the step
    # is there but damaged, nor of the steps that restore.
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    params = run / "2" / "params.safetensors"
    _flip(params, _tensor_ranges(params)[-1][0])
    opt = run / "3" / "opt.safetensors"
    opt.write_bytes(opt.read_bytes()[:-8])  # truncated
    manager = CheckpointManager(run)
    for step, file in ((2, params), (None, opt)):
        with pytest.raises(CorruptFileError) as raised:
            manager.restore(step)
        message = str(raised.value)
        assert message.startswith(f"step {step or 3} of {run} is damaged: leaf ")
        assert f"of {file}:" in message and "manager.latest_intact_step()" in message, message
        assert raised.value.file == str(file)
    assert manager.latest_intact_step() == 1
    assert manager.restore(fallback=True, as_numpy=True)["opt"]["mu"][0] == 0.1 and list(manager.restored.skipped) == [
        3,
        2,
    ]


def test_verify_is_checked_and_progress_is_drawn(saved, capsys):
    manager = CheckpointManager(saved)
    with pytest.raises(ValueError, match='verify must be "data"'):
        manager.damaged_steps(verify="all")
    assert manager.latest_intact_step(progress=True) == 3
    assert "verifying step 3" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fifo", "device", "loop"])
def test_an_item_file_that_is_no_regular_file_is_damage_skipped_by_recovery_and_listed(saved, tmp_path, capsys, kind):
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    item = run / "3" / "params.safetensors"
    item.unlink()
    if kind == "fifo":
        os.mkfifo(item)  # a read of it would wait for a writer for ever
    else:
        item.symlink_to("/dev/zero" if kind == "device" else item)
    manager = CheckpointManager(run)
    assert list(manager.damaged_steps()) == [3] and manager.latest_intact_step() == 2
    _check_restored(manager.restore(fallback=True, as_numpy=True), 2)
    assert manager.restored is not None and list(manager.restored.skipped) == [3]
    for command in ("ls", "verify"):
        assert main([command, str(run)]) == 1
        assert "damaged" in capsys.readouterr().out


def test_a_step_folder_copied_under_a_higher_number_does_not_make_the_keep_policy_delete_the_intact_steps(tmp_path):
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=2)) as manager:
        for step in (1, 2, 3):
            manager.save(step, {"w": np.full(4, float(step))})
    shutil.copytree(tmp_path / "2", tmp_path / "9")  # a "backup" copy: its record says step 2
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=1)) as manager:
        manager.save(4, {"w": np.full(4, 4.0)})
        manager.wait()
        assert manager.steps() == [4, 9]  # was [9]: 2, 3 and the new 4 deleted as older than "9"
        assert float(manager.restore(fallback=True)["w"][0]) == 4.0


@pytest.mark.parametrize(
    "found_by", ["restore", "damaged_steps", "latest_intact_step", "damaged_steps, then metrics", "the docs' recipe"]
)
def test_a_step_found_damaged_does_not_count_among_the_steps_keep_last_keeps(tmp_path, found_by):
    # A query that read the step's record afterwards (metrics, items, best_step) forgot the damage, as did
    # latest_intact_step: the keep policy then deleted intact step 1 and kept damaged step 2.
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=2)) as manager:
        for step in (1, 2):
            manager.save(step, {"w": np.full(1000, float(step))})
    with open(tmp_path / "2" / "w.safetensors", "r+b") as file:  # bit rot in step 2's data
        file.seek(-8, 2)
        file.write(b"\xff" * 8)
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=2)) as manager:
        if found_by == "restore":
            assert float(manager.restore(fallback=True)["w"][0]) == 1.0
        elif found_by == "latest_intact_step":
            assert manager.latest_intact_step() == 1
        elif found_by == "the docs' recipe":
            assert float(manager.restore(manager.latest_intact_step())["w"][0]) == 1.0
        else:
            assert list(manager.damaged_steps()) == [2]
            if found_by.endswith("metrics"):
                assert manager.metrics(2) is None and manager.items(2) == ["w"]
        manager.save(3, {"w": np.full(1000, 3.0)})
        manager.wait()
        assert manager.steps() == [1, 2, 3]  # two intact steps, and the damaged one left for a look
        manager.save(4, {"w": np.full(1000, 4.0)})
        manager.wait()
        assert manager.steps() == [2, 3, 4]


def test_saving_again_a_step_that_a_fallback_skipped_says_it_is_damaged(saved, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    start, _ = _tensor_ranges(run / "3" / "opt.safetensors")[0]
    _flip(run / "3" / "opt.safetensors", start)
    with CheckpointManager(run) as manager:
        manager.restore(fallback=True)
        assert manager.restored is not None and list(manager.restored.skipped) == [3]
        with pytest.raises(CheckpointError, match=r"step 3 already exists in .*, damaged; pass force=True"):
            manager.save(3, _state(3))
        manager.save(3, _state(3), force=True)
    with CheckpointManager(run) as manager:
        assert manager.damaged_steps() == {}
        _check_restored(manager.restore(as_numpy=True), 3)
