"""A step record whose checksum is right but whose values no manager writes (a metric no float holds, a time no date
has, keep rules no KeepPolicy takes) is a damaged record, named when it is read: the manager's queries, its prune and
``jaxstow ls`` say so instead of failing later with an OverflowError or a TypeError. A metric too large for a float is
refused when it is saved. A record too large to be one (a sparse file of gigabytes in its place) is refused unread,
and metadata that would make one is refused when it is saved."""

from __future__ import annotations

import dataclasses
import tracemalloc

import forked_cli
import numpy as np
import pytest

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow._steps.record import RECORD_NAME, StepRecord
from jaxstow.errors import ArgumentError, CorruptFileError, MetadataError

FORGED = [
    {"metrics": {"loss": 10**400}},
    {"time": 1e300},
    {"time": -1e20},
    {"keep_policy": {"keep_best": 1, "metric": ["loss"]}},
    {"keep_policy": {"keep_best": 1, "metric": "loss", "mode": ["min"]}},
    {"keep_policy": {"keep_last": 0}},
    {"keep_policy": {"keep_every_seconds": 10**400}},
]


@pytest.fixture
def run(tmp_path):
    folder = tmp_path / "run"
    with CheckpointManager(folder, keep=KeepPolicy(keep_last=3, keep_best=1, metric="loss")) as manager:
        for step in (1, 2, 3):
            manager.save(step, {"w": np.full(2, float(step))}, metrics={"loss": 1 / step})
    return folder


def _forge(folder, step: int, **changes) -> None:
    """Rewrite a step's record with ``changes``, its checksum computed again, as a record written by hand would be."""
    path = folder / str(step) / RECORD_NAME
    record = StepRecord.from_json(path.read_bytes(), where=str(path))
    path.write_bytes(dataclasses.replace(record, **changes).to_json())


def test_a_metric_no_float_holds_is_refused_when_saved(tmp_path):
    with CheckpointManager(tmp_path / "run") as manager:
        with pytest.raises(ArgumentError, match=r"metric 'loss' of step 1 must be a number a float holds, not 1000"):
            manager.save(1, {"w": np.zeros(2)}, metrics={"loss": 10**400})
        assert manager.steps() == []


@pytest.mark.parametrize("changes", FORGED, ids=lambda changes: repr(changes)[:40])
def test_a_forged_record_is_damaged_when_read(run, changes):
    _forge(run, 2, **changes)
    where = str(run / "2" / RECORD_NAME)
    with pytest.raises(CorruptFileError, match="lacks a field or has one of the wrong type") as caught:
        StepRecord.from_json((run / "2" / RECORD_NAME).read_bytes(), where=where)
    assert caught.value.file == where
    manager = CheckpointManager(run, keep=KeepPolicy(keep_last=1, keep_best=1, metric="loss"))
    with pytest.raises(CorruptFileError, match=r"2/checkpoint\.json: the step record lacks a field"):
        manager.metrics(2)
    assert manager.damaged_steps(verify="headers").keys() == {2}
    manager.save(4, {"w": np.zeros(2)}, metrics={"loss": 5.0})  # its prune leaves the damaged step out of its rules
    manager.close()
    assert manager.steps() == [2, 3, 4]  # the best and the last of the intact steps; the damaged one left for a look


@pytest.mark.parametrize("changes", FORGED, ids=lambda changes: repr(changes)[:40])
def test_ls_lists_a_forged_record_as_damaged(run, changes):
    _forge(run, 3, **changes)
    done = forked_cli.jaxstow_command("ls", run)
    assert done.returncode == 1 and done.stderr == "", (done.stdout, done.stderr)
    out = done.stdout.splitlines()
    assert [line.split()[0] for line in out[1:4]] == ["1", "2", "3"]
    assert out[4].startswith(
        f"DAMAGED  step 3: {run / '3' / RECORD_NAME}: the step record lacks a field or has one of the wrong type or "
        f"out of range: {next(iter(changes))!r} is "
    )
    assert out[5].startswith("3 steps (1 damaged), ")


def test_keep_rules_of_the_wrong_type_are_refused():
    with pytest.raises(
        ArgumentError, match=r"metric must be the name of a metric \(a string\) or None, not \['loss'\]"
    ):
        KeepPolicy(keep_best=1, metric=["loss"])  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="keep_every_seconds must be a positive number"):
        KeepPolicy(keep_every_seconds=10**400)
    assert KeepPolicy(keep_every_seconds=10**300).reasons([1, 2], {}, {1: 0.0, 2: 1.0}) == {
        1: ["every 1e+300 s"],
        2: ["newest"],
    }


def test_a_record_larger_than_any_jaxstow_writes_is_refused_unread(run):
    record = run / "3" / RECORD_NAME
    with record.open("r+b") as file:
        file.truncate(256 << 20)  # sparse: 256 MiB that take no disk
    manager = CheckpointManager(run)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptFileError, match=r"3/checkpoint\.json: is larger than the 67108864 bytes \(64 MiB\)"):
            manager.restore(3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"refusing the record allocated {peak} bytes"
    assert manager.restore(fallback=True)["w"].tolist() == [2.0, 2.0]
    assert manager.restored.skipped.keys() == {3}


def test_metadata_past_what_a_record_may_hold_is_refused_when_saved(tmp_path):
    with CheckpointManager(tmp_path / "run") as manager:
        with pytest.raises(MetadataError, match=r"metadata of step 1 takes 17825\d+ bytes in the step's record, more"):
            manager.save(1, {"w": np.zeros(2)}, metadata={"notes": "x" * (17 << 20)})
        manager.save(2, {"w": np.zeros(2)}, metadata={"notes": "x" * (15 << 20)})
        assert manager.steps() == [2] and len(manager.metadata(2)["notes"]) == 15 << 20


@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({"files": {"w": "../1/w.safetensors"}}, "'files' is {'w': '../1/w.safetensors'}, expected a dict of item"),
        ({"files": {"w": "/etc/w.safetensors"}}, "'files' is {'w': '/etc/w.safetensors'}, expected a dict of item"),
        (
            {"headers": {"w.safetensors": 7}},
            "'headers' is {'w.safetensors': 7}, expected null or a dict of each of the step's files",
        ),
        ({"parts": {"w": ["../2/w.safetensors"]}}, "'parts' is {'w': ['../2/w.safetensors']}, expected a dict of"),
    ],
)
def test_a_record_naming_files_outside_its_step_is_refused_naming_the_field_and_what_it_must_hold(run, changes, shown):
    _forge(run, 3, **changes)
    with CheckpointManager(run) as manager, pytest.raises(CorruptFileError, match="restore another step") as caught:
        manager.restore(3)
    assert (
        f"{run / '3' / RECORD_NAME}: the step record lacks a field or has one of the wrong type or out of range: "
        + (shown)
        in str(caught.value)
    )


def test_a_record_naming_a_file_with_a_nul_is_damaged(run):
    _forge(run, 2, files={"w": "w\0.safetensors"}, headers=None)  # as in a record of version 1, which has none
    with pytest.raises(CorruptFileError, match=r"2/checkpoint\.json: the step record lacks a field .*'files' is"):
        CheckpointManager(run).restore(2)
