"""Files and folders of other libraries crafted by a stranger (an orbax folder whose metadata claims what it does not
hold): ``jaxstow.load(..., from_format=...)`` and ``jaxstow convert`` refuse each with a ``FormatError`` naming it,
without running out of memory, aborting or running code."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import socket
import sys
import tempfile
import warnings
import zipfile

import forked
import numpy as np
import pytest

import jaxstow
from jaxstow.errors import CorruptFileError, FormatError, PathError

ocp = pytest.importorskip("orbax.checkpoint")
from orbax_folders import convert, orbax_folder  # noqa: E402 - needs orbax


def test_an_orbax_folder_claiming_arrays_past_the_machines_memory_is_refused_before_they_are_allocated(tmp_path):
    folder = orbax_folder(tmp_path / "ckpt", {"w": np.ones(4, np.float32)})
    zarray = folder / "w" / ".zarray"
    claimed = {**json.loads(zarray.read_text()), "shape": [2**40]}  # 4 TiB of float32, from a folder of 1 KiB
    zarray.write_text(json.dumps(claimed))
    done = convert(folder, tmp_path / "out.jxs")  # a process of its own: orbax's allocation aborted the process
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{folder}: its metadata claims 4398046511104 bytes of arrays, more than the" in done.stderr
    assert not (tmp_path / "out.jxs").exists()


@pytest.mark.parametrize("name", ["w/.zarray", "_METADATA"])
def test_an_orbax_metadata_file_nested_deep_is_refused_naming_it_before_tensorstore_parses_it(tmp_path, name):
    folder = orbax_folder(tmp_path / "ckpt", {"w": np.ones(4, np.float32)})
    (folder / name).write_text("[" * 100_000 + "]" * 100_000)  # tensorstore's parser recursed until it crashed
    done = convert(folder, tmp_path / "out.jxs")  # a process of its own: the crash took the process down
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{folder / name}: orbax's metadata is not valid JSON (maximum recursion depth exceeded" in done.stderr
    assert not (tmp_path / "out.jxs").exists()


def test_an_array_metadata_nested_deep_inside_an_ocdbt_database_is_refused_before_tensorstore_parses_it(tmp_path):
    tensorstore = pytest.importorskip("tensorstore")
    folder = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)) as checkpointer:  # orbax's default
            checkpointer.save(folder, args=ocp.args.PyTreeSave({"w": np.ones(4, np.float32)}))
    database = tensorstore.KvStore.open({"driver": "ocdbt", "base": f"file://{folder}/"}).result()
    database.write(b"w/.zarray", b"[" * 100_000 + b"]" * 100_000).result()  # a key of the database, not a file
    done = convert(folder, tmp_path / "out.jxs")  # a process of its own: tensorstore's parser crashed it
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{folder / 'w' / '.zarray'}: orbax's metadata is not valid JSON (maximum recursion depth" in done.stderr
    assert not (tmp_path / "out.jxs").exists()


@pytest.mark.parametrize("item", ["../../../outside", "/etc", "missing"])
def test_an_orbax_step_naming_an_item_outside_its_folder_is_refused_without_reading_there(tmp_path, item):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text('{"token": "not for the step"}')  # what the item would read, as JSON
    step = tmp_path / "run" / "deep" / "3"
    step.mkdir(parents=True)
    (step / "_CHECKPOINT_METADATA").write_text(json.dumps({"item_handlers": {item: "JsonCheckpointHandler"}}))
    with pytest.raises(FormatError, match=rf"{step}: names the item '{item}', which is no folder of the step"):
        jaxstow.load(step, from_format="orbax")
    done = convert(step, tmp_path / "out.jxs")
    assert done.returncode == 2 and "which is no folder of the step" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("link", ["w", "w/0"])
def test_a_link_out_of_an_orbax_folder_is_refused_naming_it(tmp_path, link):
    folder = orbax_folder(tmp_path / "ckpt", {"w": np.ones(4, np.float32)})
    elsewhere = orbax_folder(tmp_path / "elsewhere", {"w": np.full(4, 7, np.float32)})  # another's, the same shape
    shutil.rmtree(folder / "w")
    if link == "w/0":
        (folder / "w").mkdir()
        shutil.copy(elsewhere / "w" / ".zarray", folder / "w" / ".zarray")
    os.symlink(elsewhere / link, folder / link)
    with pytest.raises(PathError, match=rf"{folder / link}: is a link to {elsewhere / link}, outside the orbax folder"):
        jaxstow.load(folder, from_format="orbax")
    assert jaxstow.load(elsewhere, from_format="orbax", as_numpy=True)["w"].tolist() == [7.0] * 4


@pytest.mark.parametrize("link", ["a", "a/0"])
def test_a_link_within_an_orbax_folder_to_another_arrays_data_is_refused(tmp_path, link):
    folder = orbax_folder(tmp_path / "ckpt", {"a": np.arange(4.0, dtype=np.float32), "b": -np.ones(4, np.float32)})
    target = folder / link.replace("a", "b", 1)
    if link == "a":
        shutil.rmtree(folder / "a")
    else:
        (folder / link).unlink()
    os.symlink(target, folder / link)  # a's data read from b's: the load gave a == b
    with pytest.raises(PathError, match=rf"{folder / link}: is a link to {target}, another place in the orbax"):
        jaxstow.load(folder, from_format="orbax")


@pytest.mark.parametrize("ocdbt", [False, True])
@pytest.mark.parametrize("key", ["a/", "a//", "a/."])
def test_an_orbax_leaf_whose_name_is_another_leafs_spelt_otherwise_is_refused(tmp_path, key, ocdbt):
    folder = orbax_folder(tmp_path / "ckpt", {"a": np.arange(4.0), "b": -np.arange(4.0)}, ocdbt=ocdbt)
    metadata = json.loads((folder / "_METADATA").read_text())
    metadata["tree_metadata"]["('b',)"]["key_metadata"] = [{"key": key, "key_type": 2}]
    (folder / "_METADATA").write_text(json.dumps(metadata))  # b's leaf read from a's place: b lost, a twice
    with pytest.raises(FormatError, match=rf"names two leaves, '(a|{key})' and '(a|{key})', that orbax reads from one"):
        jaxstow.load(folder, from_format="orbax")


def test_an_orbax_folder_claiming_more_than_the_process_may_use_is_refused_before_it_is_allocated(tmp_path):
    folder = orbax_folder(tmp_path / "ckpt", {"w": np.ones(4, np.float32)})
    zarray = folder / "w" / ".zarray"
    claimed = {**json.loads(zarray.read_text()), "shape": [4 << 30], "chunks": [8]}  # 16 GiB in chunks of 8
    zarray.write_text(json.dumps(claimed))
    limited = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30)); "
        "from jaxstow.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = forked.run(
        [sys.executable, "-c", limited, "convert", str(folder), str(tmp_path / "out.jxs")],
        capture_output=True,
        text=True,
        timeout=300,
    )  # under ulimit -v 8 GiB, tensorstore's allocation aborted the process (bad_alloc)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{folder}: its metadata claims 17179869184 bytes of arrays, more than the" in done.stderr
    assert not (tmp_path / "out.jxs").exists()


@pytest.mark.parametrize("absolute", [True, False])
def test_an_orbax_leaf_named_by_a_path_out_of_its_folder_is_refused_without_reading_there(tmp_path, absolute):
    folder = orbax_folder(tmp_path / "ckpt", {"w": np.ones(4, np.float32)})
    elsewhere = orbax_folder(tmp_path / "elsewhere", {"w": np.full(4, 7, np.float32)})  # another's, the same shape
    name = str(elsewhere / "w") if absolute else "../elsewhere/w"
    metadata = (folder / "_METADATA").read_text().replace('"key": "w"', f'"key": "{name}"')
    (folder / "_METADATA").write_text(metadata)  # orbax read the array from the folder the name gives, outside
    with pytest.raises(FormatError, match=rf"{folder / '_METADATA'}: names the leaf '{name}', which orbax reads"):
        jaxstow.load(folder, from_format="orbax")
    done = convert(folder, tmp_path / "out.jxs")
    assert done.returncode == 2 and f"names the leaf '{name}'" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "out.jxs").exists()


def test_an_orbax_json_item_that_is_a_fifo_is_refused_without_waiting_on_it(tmp_path):
    run = tmp_path / "run"
    options = ocp.CheckpointManagerOptions(best_fn=lambda metrics: metrics["loss"], best_mode="min")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ocp.CheckpointManager(run, options=options) as manager:
            manager.save(1, args=ocp.args.StandardSave({"w": np.ones(2, np.float32)}), metrics={"loss": 0.5})
            manager.wait_until_finished()
    metrics = run / "1" / "metrics" / "metrics"
    metrics.unlink()
    os.mkfifo(metrics)  # opening it to read waited for a writer that never comes
    done = convert(run, tmp_path / "out")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{metrics}: is a FIFO, where orbax keeps regular files" in done.stderr
    assert not (tmp_path / "out").exists()


def _replace_with(path, kind):
    """Put a file of ``kind`` where ``path`` is; a bound socket is returned, to be closed."""
    path.unlink()
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "link to nothing":
        os.symlink(path.with_name("gone"), path)
    elif kind == "socket":  # bound at a short path (a socket's path is at most 107 bytes), then moved in place
        bound, short = socket.socket(socket.AF_UNIX), tempfile.mktemp(dir=path.parents[2])
        bound.bind(short)
        os.rename(short, path)
        return bound
    return None


@pytest.mark.parametrize("kind", ["FIFO", "socket", "link to nothing"])
@pytest.mark.parametrize("place", ["a zarr chunk", "a file of an OCDBT database", "an OCDBT manifest"])
def test_an_orbax_data_file_that_is_no_regular_file_is_refused_naming_it_without_waiting_on_it(tmp_path, place, kind):
    tree = {"w": np.ones(4, np.float32)}
    if place == "a zarr chunk":
        folder = orbax_folder(tmp_path / "ckpt", tree)
        target = folder / "w" / "0"
    else:
        folder = orbax_folder(tmp_path / "ckpt", tree, ocdbt=True)
        target = folder / "manifest.ocdbt" if place == "an OCDBT manifest" else next((folder / "d").iterdir())
    bound = _replace_with(target, kind)
    expected = (
        f"is a link to {target.with_name('gone')}, which does not exist"
        if kind == "link to nothing"
        else f"is a {kind}, where orbax keeps regular files"
    )
    try:  # tensorstore waited on a FIFO for a writer that never comes; orbax called a link to nothing no checkpoint
        done = convert(folder, tmp_path / "out.jxs")  # a process of its own, with a timeout: a wait fails the test
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"{target}: {expected}" in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr and not (tmp_path / "out.jxs").exists()
        with pytest.raises(FormatError, match=re.escape(f"{target}: {expected}")):  # the command did not wait
            jaxstow.load(folder, from_format="orbax")
    finally:
        if bound is not None:
            bound.close()


def test_a_torch_tensor_repeating_its_storage_into_more_than_the_file_is_refused_before_it_is_made(tmp_path):
    torch = pytest.importorskip("torch")
    # 4 bytes shown as 2**30 float32 (4 GiB), as torch.save keeps a view made by expand: its storage, shape, strides
    torch.save({"w": torch.ones(1).expand(2**15, 2**15), "b": torch.ones(3).expand(2, 3)}, tmp_path / "huge.pt")
    with pytest.raises(
        FormatError,
        match=r"leaf 'w' of .*huge\.pt: holds a tensor of shape \[32768, 32768\] and strides \[0, 0\] that repeats "
        r"the 4 bytes of its storage into 4294967296, more than the file's \d+: save tensor.contiguous\(\) of it",
    ):
        jaxstow.load(tmp_path / "huge.pt", from_format="torch")
    torch.save({"b": torch.ones(3).expand(2, 3)}, tmp_path / "small.pt")  # repeated within the file's size: made
    assert jaxstow.load(tmp_path / "small.pt", from_format="torch", as_numpy=True)["b"].tolist() == [[1.0] * 3] * 2


def _recompressed(plain, out, expanded=None):
    """``plain``, torch's zip, with its tensor records compressed, each inflating to ``expanded`` zeros if given."""
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            data = source.read(info)
            record = zipfile.ZipInfo(info.filename)
            if "/data/" in info.filename:
                record.compress_type = zipfile.ZIP_DEFLATED
                data = data if expanded is None else bytes(expanded)
            archive.writestr(record, data)
    return out


def test_a_torch_record_compressed_to_expand_past_the_file_is_refused_before_torch_inflates_it(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.arange(4.0)}, tmp_path / "plain.pt")
    # 16 bytes of tensor whose record inflates to 64 MiB: torch.load inflated it whole before comparing it with them
    bomb = _recompressed(tmp_path / "plain.pt", tmp_path / "bomb.pt", expanded=2**26)
    with pytest.raises(
        FormatError,
        match=rf"{re.escape(str(bomb))}: its record 'plain/data/0' expands from \d+ to 67108864 bytes, more than the "
        r"file's \d+: torch.save stores records uncompressed, .* save its tensors again with torch.save",
    ):
        jaxstow.load(bomb, from_format="torch")
    done = convert(bomb, tmp_path / "bomb.jxs")
    assert done.returncode == 2 and "expands from" in done.stderr, done.stderr[-2000:]
    recompressed = _recompressed(tmp_path / "plain.pt", tmp_path / "recompressed.pt")  # within the file: read
    assert jaxstow.load(recompressed, from_format="torch", as_numpy=True)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_torch_file_whose_tensor_bytes_changed_is_damaged_by_its_zip_checksums(tmp_path):
    """Was: the changed values loaded, silently (torch.load reads the records without their CRC-32)."""
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(4)}, tmp_path / "plain.pt")
    data = bytearray((tmp_path / "plain.pt").read_bytes())
    data[data.index(np.ones(4, np.float32).tobytes())] ^= 0x01  # 1.0 read as 1.0000001
    (tmp_path / "flipped.pt").write_bytes(bytes(data))
    with pytest.raises(
        CorruptFileError, match=r"flipped\.pt: the bytes of its record 'plain/data/0' do not match the "
    ):
        jaxstow.load(tmp_path / "flipped.pt", from_format="torch")
    done = convert(tmp_path / "flipped.pt", tmp_path / "flipped.jxs")
    assert done.returncode != 0 and "CRC-32" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "flipped.jxs").exists()
    assert jaxstow.load(tmp_path / "plain.pt", from_format="torch", as_numpy=True)["w"].tolist() == [1.0] * 4


class _Runs:
    """What unpickling would call: ``function(*arguments)``, such as ``os.system("touch MARKER")``."""

    def __init__(self, function, *arguments) -> None:
        self.call = (function, arguments)

    def __reduce__(self):
        return self.call


@pytest.mark.parametrize(
    ("call", "named"), [("system", r"(posix|nt)\.system"), ("eval", "eval")], ids=["os-system", "builtins-eval"]
)
def test_a_torch_file_naming_a_global_that_runs_code_is_refused_without_running_it_or_advising_to(
    tmp_path, call, named
):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "code-ran"
    payload = {
        "system": _Runs(os.system, f"touch {marker}"),
        "eval": _Runs(eval, f"open({str(marker)!r}, 'w')"),
    }[call]
    torch.save({"w": torch.ones(2)}, tmp_path / "plain.pt")
    with zipfile.ZipFile(tmp_path / "plain.pt") as plain, zipfile.ZipFile(tmp_path / "evil.pt", "w") as evil:
        for info in plain.infolist():  # torch's own zip, its pickle replaced by one that calls `call`
            data = pickle.dumps({"w": payload}, protocol=2) if info.filename.endswith("data.pkl") else None
            evil.writestr(info.filename, data or plain.read(info))
    with pytest.raises(FormatError, match=rf"it holds an object of {named}, which torch.load\(weights_only=True\)"):
        jaxstow.load(tmp_path / "evil.pt", from_format="torch")
    done = convert(tmp_path / "evil.pt", tmp_path / "evil.jxs")
    assert done.returncode == 2 and "weights_only` set to `False" not in done.stderr, done.stderr[-2000:]
    assert re.search(rf"it holds an object of {named}, which torch.load\(weights_only=True\)", done.stderr)
    assert not marker.exists() and not (tmp_path / "evil.jxs").exists()


@pytest.mark.parametrize("metadata", ["[]", '"x"', '{"tree_metadata": []}', '{"tree_metadata": 1.5}'])
def test_orbax_metadata_of_json_that_is_not_orbaxs_is_a_format_error_naming_the_folder(tmp_path, metadata):
    folder = orbax_folder(tmp_path / "ckpt", {"w": np.ones(4, np.float32)})
    (folder / "_METADATA").write_text(metadata)  # orbax raised AttributeError ('list' object has no attribute 'get')
    with pytest.raises(FormatError, match=rf"{folder}: not an orbax checkpoint that orbax can restore"):
        jaxstow.load(folder, from_format="orbax")
