"""``checkpoint.json``: a step's record reads back as written, and any change to it, or an item file that is not the
one it names, is an error naming the record."""

from __future__ import annotations

import json
import math
import random

import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._format.header_checksum import header_checksum
from jaxstow._steps.record import StepRecord, check_item_header, check_metadata, check_metrics, missing_item_file
from jaxstow._storage.sources import LocalFile
from jaxstow.errors import (
    ArgumentError,
    CheckpointError,
    CorruptFileError,
    MetadataError,
    NewerFormatError,
)

WHERE = "run/3/checkpoint.json"


def _record(**changes) -> StepRecord:
    fields = dict(
        step=3,
        files={"params": "params.safetensors", "opt": "opt.safetensors"},
        single=False,
        metrics={"loss": 0.25, "accuracy": None},
        metadata={"epoch": 1, "note": "é"},
        time=1700000000.125,
        keep_policy={"keep_last": 2},
        parts={"params": ["params.1.safetensors"]},
        headers={
            "params.safetensors": "0123456789abcdef",
            "params.1.safetensors": "fedcba9876543210",
            "opt.safetensors": "00112233445566ff",
        },
    )
    return StepRecord(**{**fields, **changes})


def test_a_record_reads_back_as_written():
    record = _record()
    assert StepRecord.from_json(record.to_json(), where=WHERE) == record
    assert record.item_files("params") == ["params.safetensors", "params.1.safetensors"]
    assert record.item_files("opt") == ["opt.safetensors"] and record.metric("loss") == 0.25
    single = StepRecord(step=0, files={"tree": "tree.safetensors"}, single=True, time=1.5)
    assert StepRecord.from_json(single.to_json(), where=WHERE) == single


def test_the_record_is_plain_json_that_ends_with_its_checksum():
    text = json.loads(_record().to_json())
    assert list(text)[-1] == "record_xxh3" and len(text["record_xxh3"]) == 16
    assert text["library"].startswith("jaxstow ") and text["record_version"] == 2


def test_every_changed_byte_is_caught():
    data = _record().to_json()
    rng = random.Random(0)
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] = rng.choice([byte for byte in b' 0123456789abcdef"{}:,.x\n' if byte != data[position]])
        with pytest.raises(CorruptFileError, match=f"^{WHERE}: ") as caught:
            StepRecord.from_json(bytes(damaged), where=WHERE)
        assert caught.value.file == WHERE


def test_a_truncated_or_empty_record_is_corrupt():
    data = _record().to_json()
    for length in (0, 1, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptFileError):
            StepRecord.from_json(data[:length], where=WHERE)


def test_a_record_whose_version_is_changed_to_1_still_has_its_checksum_checked():
    # Version 1 records have no checksum: two bytes (the version and a metric) changed the best step, unseen.
    data = _record().to_json().replace(b'"record_version": 2', b'"record_version": 1')
    with pytest.raises(CorruptFileError, match="checksum does not match"):
        StepRecord.from_json(data, where=WHERE)


def test_a_record_of_a_newer_jaxstow_says_to_upgrade():
    data = _record().to_json().replace(b'"record_version": 2', b'"record_version": 3')
    with pytest.raises(NewerFormatError, match=r"record version 3.*reads versions up to 2: upgrade jaxstow") as caught:
        StepRecord.from_json(data, where=WHERE)
    assert not isinstance(caught.value, CorruptFileError)
    hostile = data.replace(b'"record_version": 3', b'"record_version": 3, "library": "\\u001b[2Jjaxstow 9"')
    with pytest.raises(NewerFormatError) as caught:
        StepRecord.from_json(hostile, where=WHERE)
    assert "\x1b" not in str(caught.value) and "\\x1b[2Jjaxstow 9" in str(caught.value)  # escaped, never raw


def test_a_step_of_a_newer_jaxstow_is_no_damage_to_ls_or_verify(tmp_path, monkeypatch):
    import subprocess
    import sys

    import numpy as np

    import jaxstow._steps.record as record_module
    from jaxstow import CheckpointManager

    monkeypatch.setattr(record_module, "_RECORD_VERSION", 3)  # a jaxstow to come writes the step
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"w": np.ones(2)})
    monkeypatch.undo()
    with CheckpointManager(tmp_path / "run") as manager, pytest.raises(NewerFormatError, match="upgrade jaxstow"):
        manager.restore(fallback=True)  # never taken for damage, nor skipped for an older step
    for command in ("ls", "verify"):
        done = subprocess.run(
            [sys.executable, "-m", "jaxstow", command, str(tmp_path / "run")], capture_output=True, text=True
        )
        assert done.returncode == 2 and "DAMAGED" not in done.stdout and "upgrade jaxstow" in done.stderr, done


@pytest.mark.parametrize(
    "changes",
    [
        {"files": {"params": "../outside.safetensors"}},
        {"files": {"params": "sub/params.safetensors"}},
        {"files": {"a": "a.safetensors", "b": "b.safetensors"}, "single": True},
        {"parts": {"missing_item": ["x.safetensors"]}},
        {"headers": {"not_a_file_of_the_step": "0123456789abcdef"}},
        {"headers": {"params.safetensors": "not hex"}},
        {"headers": {}},  # every file then read unchecked: another step's files put in its place restored
        {"headers": {"params.safetensors": "0123456789abcdef", "opt.safetensors": "00112233445566ff"}},  # no part's
    ],
)
def test_a_record_that_names_what_it_cannot_is_corrupt_even_with_its_checksum_right(changes):
    with pytest.raises(CorruptFileError, match="lacks a field or has one of the wrong type"):
        StepRecord.from_json(_record(**changes).to_json(), where=WHERE)


def test_a_record_of_one_tree_naming_two_items_says_so():
    data = _record(single=True).to_json()
    with pytest.raises(
        CorruptFileError, match="'single' is True, expected a boolean, true only where 'files' names one"
    ):
        StepRecord.from_json(data, where=WHERE)


def test_metrics_are_floats_nan_becoming_none_and_infinities_kept():
    assert check_metrics({"loss": 1, "nan": math.nan, "inf": -math.inf, "np": jnp.float32(0.5)}, step=3) == {
        "loss": 1.0,
        "nan": None,
        "inf": -math.inf,
        "np": 0.5,
    }
    assert check_metrics(None, step=3) is None
    for metrics, message in [
        ([0.5], "metrics of step 3 must be a dict of names to numbers, not list"),
        ({1: 0.5}, "metric names of step 3 must be strings, not 1"),
        ({"loss": True}, "metric 'loss' of step 3 must be a number, not True"),
        ({"loss": "0.5"}, "metric 'loss' of step 3 must be a number, not '0.5'"),
        ({"loss": np.complex64(1 + 2j)}, "must be a number, not np.complex64"),  # float() would drop 2j, warning only
        ({"loss": jnp.complex64(1)}, "must be a number, not Array"),
        ({"loss": np.bool_(True)}, "must be a number, not np.True_"),
    ]:
        with pytest.raises(ArgumentError, match=message.replace("[", r"\[")):
            check_metrics(metrics, step=3)


def test_metadata_must_be_a_json_dict():
    assert check_metadata({"a": [1, "b"]}, step=3) == {"a": [1, "b"]}
    with pytest.raises(MetadataError, match="metadata of step 3 must be a JSON-able dict"):
        check_metadata({"a": {1, 2}}, step=3)
    with pytest.raises(MetadataError, match="a dict, not list"):
        check_metadata([1], step=3)


def test_an_item_file_is_checked_against_the_header_its_record_names(tmp_path):
    for name, value in (("saved", 1.0), ("other", 2.0)):
        jaxstow.save(tmp_path / f"{name}.safetensors", {"w": jnp.full(3, value)})
    saved, other = LocalFile(str(tmp_path / "saved.safetensors")), LocalFile(str(tmp_path / "other.safetensors"))
    try:
        expected = header_checksum(saved)
        record = StepRecord(
            step=3, files={"params": "params.safetensors"}, single=False, headers={"params.safetensors": expected}
        )
        check_item_header(record, "params", "params.safetensors", saved, WHERE)
        with pytest.raises(CorruptFileError, match="the file is not the one that was saved") as caught:
            check_item_header(record, "params", "params.safetensors", other, WHERE)
        assert f"expects {expected}" in str(caught.value) and caught.value.file == WHERE
        older = StepRecord(step=3, files={"params": "params.safetensors"}, single=False, headers=None)
        check_item_header(older, "params", "params.safetensors", other, WHERE)  # records before version 2: no check
    finally:
        saved.close()
        other.close()


def test_a_missing_item_file_is_named_with_its_step():
    error = missing_item_file(_record(), "opt", WHERE)
    assert isinstance(error, CheckpointError) and error.file == WHERE
    assert str(error) == f"{WHERE}: step 3 lists the item 'opt', but its file is missing"
