"""An HDF5 file of samples whose objects lead to other objects or other files (soft and external links, a dataset's
external storage, a virtual dataset) or have two names (hard links), as a stranger could send one: every reader and every run continued in it
refuses it naming the object, before HDF5 reads or writes where it leads; the other files are left as they were.

HDF5 follows each of these as if it were the file's own, so without the check a reader took another file's bytes
(any file the reader may read: a key, a token) for a chain's samples, and a run continued in the file wrote there.
"""

from __future__ import annotations

import os
import shutil
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
from jaxstow.errors import FormatError

pytest.importorskip("arviz")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of two chains of ``x``, its checkpoint beside it."""
    return sample_runs.finished_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_runs.stopped_run(tmp_path_factory.mktemp("stopped"))


def _secret(folder: Path) -> Path:
    """A file the reader may read and the sender may not: 40 float32 values from 1000 on."""
    path = folder / "secret.bin"
    (np.arange(STEPS, dtype=np.float32) + 1000).tofile(path)
    return path


def _other_h5(folder: Path) -> Path:
    path = folder / "other.h5"
    with h5py.File(path, "w") as file:
        file["x"] = np.arange(STEPS, dtype="<f4") + 2000
        file["chain"] = np.arange(STEPS, dtype="<f4") + 3000
    return path


def _tampered(run: Path, folder: Path, kind: str) -> tuple[Path, Path]:
    """In ``folder`` (made), A copy of ``run`` (and its checkpoint) whose ``/chain~0/x`` (or ``/chain~0``, or ``/draws_done``) leads
    elsewhere as ``kind`` says; and the file it leads to."""
    folder.mkdir(exist_ok=True)
    path = folder / "run.h5"
    shutil.copy(run, path)
    if os.path.exists(f"{run}.checkpoint.jxs"):
        shutil.copy(f"{run}.checkpoint.jxs", f"{path}.checkpoint.jxs")
    secret, other = _secret(folder), _other_h5(folder)
    with h5py.File(path, "r+") as file:
        if kind == "external storage":
            del file["chain~0/x"]
            file.create_dataset("chain~0/x", shape=(STEPS,), dtype="<f4", external=[(str(secret), 0, 4 * STEPS)])
            return path, secret
        if kind == "counts in external storage":
            del file["draws_done"]
            file.create_dataset("draws_done", shape=(2,), dtype="<i8", external=[(str(secret), 0, 16)])
            return path, secret
        if kind == "external link":
            del file["chain~0/x"]
            file["chain~0/x"] = h5py.ExternalLink(str(other), "x")
        elif kind == "chain as external link":
            del file["chain~0"]
            file["chain~0"] = h5py.ExternalLink(str(other), "/")
        elif kind == "virtual dataset":
            del file["chain~0/x"]
            layout = h5py.VirtualLayout(shape=(STEPS,), dtype="<f4")
            layout[:] = h5py.VirtualSource(str(other), "x", shape=(STEPS,))
            file.create_virtual_dataset("chain~0/x", layout)
        elif kind == "soft link":
            del file["chain~0/x"]
            file["chain~0/x"] = h5py.SoftLink("/chain~1/x")
        elif kind == "chain as hard link":  # a stopped run of one chain has no chain~1 yet
            file.pop("chain~1", None)
            file["chain~1"] = file["chain~0"]  # continued, chain 1's samples would be written over chain 0's
        elif kind == "dataset as hard link":
            file.pop("chain~1/x", None)
            file["chain~1/x"] = file["chain~0/x"]
        elif kind == "dangling soft link":
            del file["chain~0"]
            file["chain~0"] = h5py.SoftLink("/nowhere")
    return path, other


KINDS = [
    "external storage",
    "counts in external storage",
    "external link",
    "chain as external link",
    "virtual dataset",
    "soft link",
    "dangling soft link",
    "chain as hard link",
    "dataset as hard link",
]


def _refused(error: pytest.ExceptionInfo[FormatError], path: Path) -> None:
    message = str(error.value)
    assert str(path) in message
    assert "/chain~0" in message or "/draws_done" in message
    assert "jaxstow's collectors write none" in message


@pytest.mark.parametrize("kind", KINDS)
def test_readers_refuse_what_leads_elsewhere(finished_run: Path, tmp_path: Path, kind: str) -> None:
    path, _ = _tampered(finished_run, tmp_path, kind)
    with pytest.raises(FormatError) as error:
        io.to_inference_data(str(path))
    _refused(error, path)
    with h5py.File(path, "r") as file, pytest.raises(FormatError) as error:
        io.to_inference_data(file)
    _refused(error, path)


@pytest.mark.parametrize("kind", ["external storage", "external link", "soft link"])
def test_watch_refuses_in_one_line(
    finished_run: Path, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _tampered(finished_run, tmp_path, kind)
    assert main(["watch", str(path), "--once"]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "/chain~0/x" in err and "jaxstow's collectors write none" in err


@pytest.mark.parametrize("kind", KINDS)
def test_continued_runs_refuse_and_write_nowhere(finished_run: Path, stopped_run: Path, tmp_path: Path, kind: str):
    path, elsewhere = _tampered(finished_run, tmp_path / "finished", kind)
    before = elsewhere.read_bytes()
    with pytest.raises(FormatError) as error:
        io.run_chains(str(path), sample_runs.start, sample_runs.step, num_steps=STEPS, checkpoint_every=10)
    _refused(error, path)
    assert elsewhere.read_bytes() == before
    path, elsewhere = _tampered(stopped_run, tmp_path / "stopped", kind)
    before = elsewhere.read_bytes()
    with pytest.raises(FormatError) as error:
        io.HDF5Collector(str(path))  # continues the run from its checkpoint
    _refused(error, path)
    with h5py.File(path, "a") as file, pytest.raises(FormatError) as error:
        io.HDF5Collector(file)
    _refused(error, path)
    assert elsewhere.read_bytes() == before


def test_links_outside_the_collectors_objects_are_the_users(finished_run: Path, tmp_path: Path) -> None:
    """A user's own objects beside the chains (jax_sgmc's collector writes into the user's file) are not checked."""
    path = tmp_path / "run.h5"
    shutil.copy(finished_run, path)
    with h5py.File(path, "r+") as file:
        file["mine"] = h5py.SoftLink("/chain~1/x")
        file["theirs"] = h5py.ExternalLink(os.fspath(_other_h5(tmp_path)), "x")
    draws = io.to_inference_data(str(path)).posterior["x"].values
    np.testing.assert_array_equal(draws[:, -1], [STEPS, 10.0 + STEPS])


def test_a_strategy_used_for_many_runs_checks_only_what_each_run_writes_and_reads(tmp_path: Path, monkeypatch):
    """Each run of one collector adds chains to its file: checking every chain at each run's opening and reading back
    made a run's cost grow with the runs before it (7x slower by the 120th run)."""
    from jaxstow.io import hdf5_links

    checked: list[bytes] = []
    below = hdf5_links._refuse_below
    monkeypatch.setattr(
        hdf5_links,
        "_refuse_below",
        lambda h5py, root, key, name: (checked.append(key), below(h5py, root, key, name))[1],
    )
    init_save, save, postprocess_save = io.save(io.HDF5Collector(str(tmp_path / "run.h5")))
    information = io.scheduler.static_information(samples_collected=4)

    @jax.jit
    def run(state: Any) -> Any:
        return jax.lax.scan(lambda state, t: (save(state, True, {"x": t * 1.0})[0], None), state, jnp.arange(4))[0]

    per_run = []
    for _ in range(12):
        checked.clear()
        postprocess_save(run(init_save({"x": 0.0}, None, information)), None)
        per_run.append(len(checked))
    assert per_run[-1] == per_run[1] <= 3, per_run  # the counts and the run's own chain, not every chain of the file
