"""A checkpoint step is exported only as the manager's restore would read it: an item file that is not the one its
record names, or a step folder copied under another step's number, is refused and nothing is written; a run folder
given for a step, on a local disk or on S3, is told which step to give; arrays of no dimension keep their shape
``()``; ml_dtypes' small types keep their safetensors codes, or are refused naming the leaf."""

from __future__ import annotations

import json
import os
import shutil
import struct
import uuid

import forked_cli
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

import jaxstow
from jaxstow import CheckpointManager
from jaxstow.errors import ArgumentError, CheckpointError, CorruptFileError, IsAFolderError


@pytest.fixture
def run(tmp_path):
    folder = tmp_path / "run"
    with CheckpointManager(folder) as manager:
        for step in (1, 2):
            manager.save(step, {"params": {"w": np.full(3, step, np.float32)}, "opt": {"mu": np.full(3, 10.0 * step)}})
    return folder


def test_a_run_folder_given_for_a_step_is_told_to_name_a_step(run, tmp_path):
    with pytest.raises(IsAFolderError, match=r"is a checkpoint folder: export one of its steps, such as .*run/2"):
        jaxstow.export_safetensors(run, tmp_path / "out")  # was "restore it with jaxstow.CheckpointManager(...)"
    assert not (tmp_path / "out").exists()


def test_a_run_folder_on_s3_is_told_to_name_a_step_as_a_local_one_is(s3_server, tmp_path):
    url, options = s3_server.url(f"t-{uuid.uuid4().hex[:8]}", "run"), s3_server.storage_options
    with CheckpointManager(url, storage_options=options) as manager:
        for step in (1, 2):
            manager.save(step, {"params": {"w": np.full(3, step, np.float32)}, "opt": {"mu": np.full(3, 10.0 * step)}})
    told = f"{url}: is a checkpoint folder: export one of its steps, such as {url}/2"
    with pytest.raises(IsAFolderError) as refused:  # was "no such file or folder"
        jaxstow.export_safetensors(url, tmp_path / "out", storage_options=options)
    assert str(refused.value) == told
    flags = ["--storage-options", json.dumps(options)]
    done = forked_cli.jaxstow_command("export", url + "/", tmp_path / "out", *flags)
    assert done.returncode == 2 and done.stderr == f"jaxstow export: {url}/: {told.partition(': ')[2]}\n", done.stderr
    assert not (tmp_path / "out").exists()
    done = forked_cli.jaxstow_command("export", f"{url}/2", tmp_path / "hf", *flags)
    assert done.returncode == 0, done.stderr
    back = jaxstow.load(tmp_path / "hf", as_numpy=True)
    np.testing.assert_array_equal(back["params.w"], np.full(3, 2, np.float32))


def test_a_step_with_an_item_file_of_another_step_is_not_exported(run, tmp_path):
    shutil.copy(run / "1" / "params.safetensors", run / "2" / "params.safetensors")
    with pytest.raises(CorruptFileError, match=r"params\.safetensors: .*step 2.*not the one that was saved"):
        jaxstow.export_safetensors(run / "2", tmp_path / "hf")
    done = forked_cli.jaxstow_command("export", run / "2", tmp_path / "hf")
    assert done.returncode == 2 and "not the one that was saved" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "hf").exists()


def test_a_step_folder_copied_under_another_number_is_not_exported(run, tmp_path):
    shutil.copytree(run / "1", run / "5")
    with pytest.raises(CheckpointError, match="the record says step 1, but its folder is step 5"):
        jaxstow.export_safetensors(run / "5", tmp_path / "hf")
    shutil.copytree(run / "1", tmp_path / "best")
    with pytest.raises(CheckpointError, match="'best' is no step's folder"):
        jaxstow.export_safetensors(tmp_path / "best", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    exported = jaxstow.export_safetensors(run / "2", tmp_path / "hf")  # an intact step still exports
    assert exported.tensors == 2
    back = jaxstow.load(tmp_path / "hf", as_numpy=True)
    np.testing.assert_array_equal(back["params.w"], np.full(3, 2, np.float32))


def test_arrays_of_no_dimension_keep_their_shape(tmp_path):
    jaxstow.save(tmp_path / "m.jxs", {"scale": np.array(3.5, np.float32), "step_size": np.float32(0.1)})
    jaxstow.export_safetensors(tmp_path / "m.jxs", tmp_path / "hf")
    with safe_open(os.fspath(tmp_path / "hf" / "model-00001-of-00001.safetensors"), "np") as opened:
        assert opened.get_tensor("scale").shape == () and opened.get_tensor("scale") == np.float32(3.5)
        assert opened.get_tensor("step_size").shape == ()
    back = jaxstow.load(tmp_path / "hf", as_numpy=True)
    assert back["scale"].shape == () and back["step_size"].shape == ()


def test_ml_dtypes_small_types_are_exported_under_their_codes_or_refused_naming_the_leaf(tmp_path):
    scales = np.array([0.25, 1.0, 1024.0], np.float32).astype(ml_dtypes.float8_e8m0fnu)
    fnuz = np.array([1.0, -2.0], np.float32).astype(ml_dtypes.float8_e4m3fnuz)
    jaxstow.save(tmp_path / "m.jxs", {"scales": scales, "q": fnuz, "packed": np.zeros(4, ml_dtypes.float4_e2m1fn)})
    with pytest.raises(ArgumentError, match=r"m\.jxs: leaf 'packed' is float4_e2m1fn, .*packs several .* names="):
        jaxstow.export_safetensors(tmp_path / "m.jxs", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    # was "'scales' is float8_e8m0fnu, which safetensors has no code for": F8_E8M0 is its code
    jaxstow.export_safetensors(
        tmp_path / "m.jxs", tmp_path / "hf", names=lambda path: None if path == "packed" else path
    )
    exported = tmp_path / "hf" / "model-00001-of-00001.safetensors"
    (length,) = struct.unpack("<Q", exported.read_bytes()[:8])
    header = json.loads(exported.read_bytes()[8 : 8 + length])
    assert header["scales"]["dtype"] == "F8_E8M0" and header["q"]["dtype"] == "F8_E4M3FNUZ"
    back = jaxstow.load(tmp_path / "hf", as_numpy=True)
    for name, array in (("scales", scales), ("q", fnuz)):
        assert back[name].dtype == array.dtype and back[name].tobytes() == array.tobytes()
