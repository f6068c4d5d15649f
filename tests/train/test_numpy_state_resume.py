"""A checkpoint of numpy state resumed by the default checkpointer: whole with ``as_numpy=True``; by default as jax
arrays, a float64 one rounded to float32 where jax's 64-bit mode is off, with a warning that names it and the fix.
Advice to resume from an older file is given for a damaged file only, not for a setting every file needs."""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest

from jaxstow.errors import ArgumentError, RequestError
from jaxstow.train import Checkpoint, DefaultCheckpointer, DefaultCheckpointerArguments

X64 = bool(jax.config.read("jax_enable_x64"))


def _checkpointer(folder, **arguments) -> DefaultCheckpointer:
    return DefaultCheckpointer(
        DefaultCheckpointerArguments(save_dir=folder, model_state_save_dir=None, load_dir=folder, **arguments)
    )


def _saved(folder, state) -> None:
    _checkpointer(folder).save(Checkpoint(module_interface_state=state, trainer_state={"last_epoch": 0}), 0)


def test_a_float64_state_resumes_whole_with_as_numpy(tmp_path):
    total = np.array([16777217.1, 0.1])  # float64: float32 holds neither
    _saved(tmp_path, {"total": total})
    resumed = _checkpointer(tmp_path, as_numpy=True).load().module_interface_state["total"]
    assert type(resumed) is np.ndarray and resumed.dtype == np.float64
    np.testing.assert_array_equal(resumed, total)


@pytest.mark.skipif(X64, reason="jax's 64-bit mode is on: float64 arrays resume whole")
def test_a_float64_state_resumed_by_default_is_rounded_with_a_warning_naming_it(tmp_path, caplog):
    _saved(tmp_path, {"total": np.array([16777217.1]), "count": np.arange(3), "scale": np.ones(2, np.float32)})
    with caplog.at_level(logging.WARNING):
        resumed = _checkpointer(tmp_path).load().module_interface_state
    assert resumed["total"].dtype == np.float32 and float(resumed["total"][0]) == float(np.float32(16777217.1))
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert "['module_interface_state/total'] resumed in 32 bits" in warned[0]  # the integers resume exactly
    assert "DefaultCheckpointerArguments(as_numpy=True)" in warned[0]


@pytest.mark.skipif(X64, reason="jax's 64-bit mode is on: the state resumes whole")
def test_a_generator_state_beyond_32_bits_resumes_with_as_numpy_and_is_no_damaged_file(tmp_path):
    generator = np.random.Generator(np.random.Philox(1))
    generator.random()
    _saved(tmp_path, {"rng": generator.bit_generator.state})
    with pytest.raises(RequestError, match="holds uint64 values beyond 32 bits") as raised:
        _checkpointer(tmp_path).load()
    assert not any("move it aside" in note for note in getattr(raised.value, "__notes__", []))
    resumed = np.random.Generator(np.random.Philox())
    resumed.bit_generator.state = _checkpointer(tmp_path, as_numpy=True).load().module_interface_state["rng"]
    assert resumed.random() == generator.random()


@pytest.mark.parametrize("field", ["file_prefix", "file_ext", "save_dir", "load_dir"])
def test_a_name_holding_a_nul_character_is_refused(tmp_path, field):
    # The system's "ValueError: embedded null byte" at the first save; a load_dir with one started from scratch.
    arguments = {"save_dir": tmp_path, "model_state_save_dir": None, "load_dir": tmp_path}
    arguments[field] = "a\x00b" if field.startswith("file") else str(tmp_path / "a\x00b")
    with pytest.raises(ArgumentError, match=field):
        DefaultCheckpointer(DefaultCheckpointerArguments(**arguments)).load()
