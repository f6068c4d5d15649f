"""An HDF5 file of samples whose counts, dtypes, chain names or run id were changed by hand or by a stranger: every
reader refuses it with a FormatError naming the file and the object, where it read the wrong draws (a count of ``-1``
read as ``x[:-1]``; a finished chain's count lowered), misread their bytes (a ``jaxstow_dtype`` of another width),
raised Python's own errors, or allocated what a dataset declared but the file never stored (``2**40`` rows). A file
HDF5 fails on, with no writer having it open, is called damaged.

``jaxstow watch`` of a run whose variable is named like one of ArviZ's dimensions (``chain``) shows it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sample_runs
from sample_runs import STEPS

from jaxstow import io
from jaxstow.cli import main
from jaxstow.errors import CollectorError, FormatError
from jaxstow.io.live import read_draws, read_stacked

pytest.importorskip("arviz")


def _step_drawing_chain(state: dict[str, Any], t: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    x = state["x"] + 1.0
    return {"x": x}, {"x": x, "chain": x * 0 + t}, jnp.ones(2, bool)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_runs.finished_run(tmp_path_factory.mktemp("run"))


def _set_count(value: Any) -> Callable[[h5py.File], None]:
    def change(file: h5py.File) -> None:
        file["chain~1"].attrs["sample_count"] = value

    return change


def _replace_draws_done(data: Any) -> Callable[[h5py.File], None]:
    def change(file: h5py.File) -> None:
        del file["chain~0"].attrs["sample_count"]  # unfinished: its count is read from /draws_done
        del file["draws_done"]
        if isinstance(data, str):
            file.create_group("draws_done")
        else:
            file["draws_done"] = data

    return change


def _mark(name: Any) -> Callable[[h5py.File], None]:
    def change(file: h5py.File) -> None:
        file["chain~1/x"].attrs["jaxstow_dtype"] = name

    return change


def _replace_x(data: Any) -> Callable[[h5py.File], None]:
    def change(file: h5py.File) -> None:
        del file["chain~1/x"]
        file["chain~1/x"] = data

    return change


def _declare_rows(rows: int, chunks: tuple[int, ...] | None) -> Callable[[h5py.File], None]:
    def change(file: h5py.File) -> None:
        del file["chain~1/x"]
        file.create_dataset("chain~1/x", shape=(rows,), chunks=chunks, dtype="f4")  # nothing written: no storage
        file["chain~1"].attrs["sample_count"] = rows

    return change


def _rename(new: str) -> Callable[[h5py.File], None]:
    def change(file: h5py.File) -> None:
        file.move("chain~1", new)

    return change


def _copy_chain(new: str) -> Callable[[h5py.File], None]:
    def change(file: h5py.File) -> None:
        file.copy("chain~1", new)

    return change


def _run_id(value: Any) -> Callable[[h5py.File], None]:
    def change(file: h5py.File) -> None:
        file.attrs["jaxstow_run_id"] = value

    return change


CHANGES = {
    "count -1": (_set_count(-1), "/chain~1", "counts -1 samples, where its datasets hold 40 rows"),
    "count past the rows": (_set_count(41), "/chain~1", "counts 41 samples"),
    "count 2**62": (_set_count(2**62), "/chain~1", "counts 4611686018427387904 samples"),
    "count a float": (_set_count(2.7), "/chain~1", "counts 2.7 samples"),
    "count a string": (_set_count("12"), "/chain~1", "counts '12' samples"),
    "count a bool": (_set_count(True), "/chain~1", "counts True samples"),
    "count an array": (_set_count([1, 2]), "/chain~1", "counts"),
    "finished, counting fewer than held": (
        _set_count(39),
        "/chain~1",
        "counts 39 samples, where a finished chain's datasets, trimmed to its samples when it finished, hold 40 rows",
    ),
    "2**40 rows declared in chunks never stored": (
        _declare_rows(2**40, (4096,)),
        "/chain~1/x",
        "counts 1,099,511,627,776 samples of shape [], which take 268,435,456 chunks, where the file stores 0",
    ),
    "2**36 rows declared, not stored": (
        _declare_rows(2**36, None),
        "/chain~1/x",
        "which take 274,877,906,944 bytes, where the file stores 0",
    ),
    "draws_done negative": (_replace_draws_done(np.array([-5, 40])), "/chain~0", "counts -5 samples"),
    "draws_done 2-D": (_replace_draws_done(np.zeros((2, 2), np.int64)), "/draws_done", "is int64[2, 2]"),
    "draws_done floats": (_replace_draws_done(np.array([40.0, 40.0])), "/draws_done", "is float64[2]"),
    "draws_done a group": (_replace_draws_done("group"), "/draws_done", "is Group"),
    "dtype of another width": (_mark("bfloat16"), "/chain~1/x", "holds float32, where samples of bfloat16 are held"),
    "dtype no ml_dtypes name": (_mark("finfo"), "/chain~1/x", "which is none of ml_dtypes'"),
    "dtype a number": (_mark(3), "/chain~1/x", "which is no dtype's name"),
    "strings": (_replace_x(np.array([b"ab"] * STEPS)), "/chain~1/x", "holds samples of the dtype |S2"),
    "records": (
        _replace_x(np.zeros(STEPS, [("a", "<f4"), ("b", "<i4")])),
        "/chain~1/x",
        "which no collector writes",
    ),
    "a scalar dataset": (_replace_x(np.float32(1.0)), "/chain~1/x", "is a dataset of no rows"),
    "an empty dataset": (_replace_x(h5py.Empty("f4")), "/chain~1/x", "is a dataset of no rows"),
    "two names of one chain": (_copy_chain("chain~01"), "/chain~01", "/chain~1"),
    "a chain id past any": (_rename("chain~99999999999999999999"), "/chain~99999999999999999999", "past any"),
    "run id an array": (_run_id(np.arange(3)), "", "has the attribute jaxstow_run_id array([0, 1, 2])"),
    "run id NaN": (_run_id(float("nan")), "", "has the attribute jaxstow_run_id"),
}


def _changed(run: Path, folder: Path, change: Callable[[h5py.File], None]) -> Path:
    path = folder / "run.h5"
    shutil.copy(run, path)
    with h5py.File(path, "r+") as file:
        change(file)
    return path


@pytest.mark.parametrize("case", CHANGES)
def test_every_reader_refuses_a_changed_file_naming_the_object(finished_run: Path, tmp_path: Path, case: str):
    change, where, said = CHANGES[case]
    path = _changed(finished_run, tmp_path, change)
    readers = {
        "read_draws": lambda: read_draws(str(path)),
        "read_stacked": lambda: read_stacked(str(path)),
        "to_inference_data": lambda: io.to_inference_data(str(path)),
    }
    for reader, read in readers.items():
        with pytest.raises(FormatError) as error:
            read()
        message = str(error.value)
        assert str(path) in message and where in message and said in message, (reader, message)
    if not case.startswith("run id"):  # an open file is read once: its run id is compared only between openings
        with h5py.File(path, "r") as file, pytest.raises(FormatError, match="changed by"):
            io.to_inference_data(file)


def test_a_chain_named_with_other_digits_is_no_chain(finished_run: Path, tmp_path: Path) -> None:
    path = _changed(finished_run, tmp_path, _rename("chain~\u0661"))  # ARABIC-INDIC DIGIT ONE
    assert read_draws(str(path)).ids == [0]


def test_watch_shows_a_variable_named_as_an_arviz_dimension(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "run.h5"
    io.run_chains(str(path), sample_runs.start, _step_drawing_chain, num_steps=STEPS, checkpoint_every=10)
    assert main(["watch", str(path), "--once"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows["chain"][0] == "19.5"  # the mean of t over 0..39
    assert float(rows["x"][0]) == pytest.approx(25.5)


def test_a_file_cut_short_is_refused_not_read_with_zeros(finished_run: Path, tmp_path: Path) -> None:
    """HDF5 checks a file's size against the end its superblock records, except for a reader in SWMR mode: the
    chains a half file lost came back as zeros, with no error."""
    path = tmp_path / "run.h5"
    shutil.copy(finished_run, path)
    os.truncate(path, os.path.getsize(path) // 2)  # a copy cut off, a full disk
    for read in (lambda: read_draws(str(path)), lambda: io.to_inference_data(str(path)), lambda: read_stacked(path)):
        with pytest.raises(FormatError, match=r"truncated file: eof = \d+, stored_eof = \d+"):
            read()
    with pytest.raises(CollectorError, match=r"cannot be read as an HDF5 file \(truncated file: eof = \d+"):
        io.run_chains(str(path), sample_runs.start, sample_runs.step, num_steps=STEPS, checkpoint_every=10)


def test_another_runs_checkpoint_beside_a_stopped_run_is_refused(tmp_path: Path) -> None:
    """Two stopped runs of the same settings, one's checkpoint copied over the other's: it continued the file's
    chains from the other run's states and counts, with no error."""
    ours = sample_runs.stopped_run(tmp_path / "ours")
    theirs = sample_runs.stopped_run(tmp_path / "theirs", offset=100.0)
    shutil.copy(f"{theirs}.checkpoint.jxs", f"{ours}.checkpoint.jxs")
    before = {path: path.read_bytes() for path in (ours, Path(f"{ours}.checkpoint.jxs"))}
    collector = io.HDF5Collector(str(ours))
    init_save, _, _ = io.save(collector, checkpoint_every=4)
    with pytest.raises(CollectorError, match=r"holds the checkpoints of another run than .*run\.h5 \(run [0-9a-f]{32}"):
        init_save({"x": jnp.zeros(2)}, {"t": 0}, io.scheduler.static_information(samples_collected=24))
    collector.close()
    assert {path: path.read_bytes() for path in before} == before


def test_a_draws_done_declaring_2_40_entries_is_read_where_it_counts_only(finished_run: Path, tmp_path: Path) -> None:
    """``/draws_done`` of ``2**40`` entries, 64 of them stored, read whole as 8 TiB: only the running chains' are read."""

    def change(file: h5py.File) -> None:
        del file["chain~0"].attrs["sample_count"]
        del file["draws_done"]
        file.create_dataset("draws_done", shape=(2**40,), chunks=(64,), dtype="i8")[0] = STEPS - 5

    draws = read_draws(str(_changed(finished_run, tmp_path, change)))
    assert draws.done == [STEPS - 5, STEPS] and not draws.finished
    np.testing.assert_array_equal(draws.chains[0]["x"], np.arange(1.0, STEPS - 4))


def test_a_damaged_file_no_writer_has_open_is_called_damaged(finished_run: Path, tmp_path: Path) -> None:
    """A flipped byte in an object header was reported as a file that "could not be read in 5 attempts", as if a
    writer were starting it over; with no writer having it open, it is damaged, and said so after a second opening."""
    data = bytearray(finished_run.read_bytes())
    data[data.rindex(b"OHDR") + 8] ^= 0xFF  # the last object header: a chain's
    path = tmp_path / "run.h5"
    path.write_bytes(bytes(data))
    for read in (lambda: read_draws(str(path)), lambda: read_stacked(path), lambda: io.to_inference_data(str(path))):
        with pytest.raises(FormatError, match=r"checksum.*\), and no writer has it open: the file is damaged"):
            read()


def test_a_damaged_file_in_the_old_format_is_not_said_to_have_no_writer(tmp_path: Path) -> None:
    """A file made without ``libver="latest"`` has no writer flags: whether a writer has it open cannot be told, so
    damage found in it is not blamed on the file alone (it was, after two openings); the message names both causes."""
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as file, pytest.warns(io.LiveReadWarning):
        init_save, save, postprocess_save = io.save(io.HDF5Collector(file))
        state = init_save({"x": jnp.zeros(3)}, None, io.scheduler.static_information(samples_collected=STEPS))
        steps = jnp.arange(STEPS, dtype=jnp.float32)
        postprocess_save(jax.lax.scan(lambda s, t: (save(s, True, {"x": jnp.full(3, t)})[0], None), state, steps)[0])
    data = bytearray(path.read_bytes())
    at = data.rindex(b"TREE")  # a chain's chunk index: HDF5 fails on its signature
    data[at : at + 4] = b"XXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"could not be read in 5 attempts.*if a writer.*else the file is damaged"):
        read_draws(str(path))
