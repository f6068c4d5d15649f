"""Hugging Face folders as a download may hold them: links out, FIFOs, devices, crafted indexes and shards, sizes.

Each must be refused with a jaxstow error naming the file at fault, at once and in bounded memory, or read right.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tracemalloc
from pathlib import Path

import forked
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import jaxstow
from jaxstow._read.folder_members import (
    MAX_FOLDER_HEADER_BYTES,
    MAX_FOLDER_TENSORS,
    MAX_INDEX_BYTES,
    VALUES_PER_TENSOR,
)
from jaxstow.errors import FormatError, IsAFolderError, JaxstowError, PathError
from reliability.folder_model import MANY_TENSORS, safetensors_bytes, socket_at
from reliability.folders import bounded

INDEX = "model.safetensors.index.json"
FIRST, SECOND = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
TENSORS = {"embed.w": np.arange(12, dtype=np.float32).reshape(4, 3), "head.b": np.arange(3, dtype=np.int32)}
LIKE = {"embed": {"w": jnp.zeros((4, 3))}, "head": {"b": jnp.zeros(3, jnp.int32)}}


def _write(folder: Path, *, index: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"embed.w": TENSORS["embed.w"]}, str(folder / FIRST))
    save_file({"head.b": TENSORS["head.b"]}, str(folder / SECOND))
    if index:
        (folder / INDEX).write_text(json.dumps({"weight_map": {"embed.w": FIRST, "head.b": SECOND}}))
    return folder


@pytest.fixture
def folder(tmp_path) -> Path:
    return _write(tmp_path / "hf")


def _calls(folder: Path):
    """Every way into a folder: load, load into a tree, open and read."""

    def read() -> dict:
        with jaxstow.open(folder) as reader:
            return {path: reader[path] for path in reader.paths}

    return [lambda: jaxstow.load(folder, as_numpy=True), lambda: jaxstow.load(folder, LIKE, as_numpy=True), read]


def _refused(folder: Path, error: type[JaxstowError], culprit: str, match: str = "") -> None:
    """Every call is refused at once with ``error``, naming ``culprit``."""
    for call in _calls(folder):
        with bounded(10), pytest.raises(error, match=match) as info:
            call()
        assert culprit in str(info.value)


def test_a_shard_linked_to_a_file_outside_is_refused_by_every_call(folder, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    save_file({"embed.w": np.full((4, 3), 7, np.float32)}, str(outside))
    (folder / FIRST).unlink()
    (folder / FIRST).symlink_to(os.path.relpath(outside, folder))
    _refused(folder, PathError, FIRST, f"is a link to {outside}, outside the folder")


@pytest.mark.parametrize("form", ["file://{}", "file://localhost{}", "local://{}", "simplecache::file://{}"])
def test_a_local_folder_named_by_any_url_of_fsspecs_is_read_under_the_same_rules(folder, tmp_path, form):
    outside = tmp_path / "elsewhere.safetensors"
    save_file({"embed.w": np.full((4, 3), 7, np.float32)}, str(outside))
    (folder / FIRST).unlink()
    (folder / FIRST).symlink_to(os.path.relpath(outside, folder))
    _refused(form.format(folder), PathError, FIRST, "outside the folder")  # fsspec itself would follow the link
    (folder / FIRST).unlink()
    os.mkfifo(folder / FIRST)
    _refused(form.format(folder), PathError, FIRST, "is a FIFO")  # fsspec itself would wait on it for ever


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "/proc/self/environ"])
def test_an_index_linked_to_a_device_is_refused_without_a_byte_read(folder, target):
    (folder / INDEX).unlink()
    (folder / INDEX).symlink_to(target)
    tracemalloc.start()
    try:
        _refused(folder, PathError, INDEX, "outside the folder")
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


def test_links_that_stay_inside_the_folder_are_followed(folder):
    (folder / "real").mkdir()
    os.replace(folder / FIRST, folder / "real" / FIRST)
    (folder / FIRST).symlink_to(os.path.join("real", FIRST))
    os.replace(folder / SECOND, folder / "real" / SECOND)
    (folder / SECOND).symlink_to(folder / "real" / SECOND)  # an absolute link, inside too
    (folder.parent / "alias").symlink_to(folder)
    np.testing.assert_array_equal(jaxstow.load(folder.parent / "alias", as_numpy=True)["embed.w"], TENSORS["embed.w"])


def _hub_cache(tmp_path: Path, sub: str = "") -> Path:
    """A Hugging Face cache as ``huggingface_hub`` lays it out: blobs, and a snapshot of relative links to them."""
    written = _write(tmp_path / "written")
    repository = tmp_path / "hub" / "models--org--tiny"
    snapshot = repository / "snapshots" / "0123abcd" / sub
    (repository / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for number, name in enumerate([FIRST, SECOND, INDEX]):
        os.replace(written / name, repository / "blobs" / f"{number:040x}")
        (snapshot / name).symlink_to(os.path.relpath(repository / "blobs" / f"{number:040x}", snapshot))
    return snapshot


@pytest.mark.parametrize("sub", ["", "transformer"])
def test_a_hugging_face_cache_snapshot_is_read_through_its_links(tmp_path, sub):
    snapshot = _hub_cache(tmp_path, sub)
    for call in _calls(snapshot):
        got = call()
        leaf = got["embed"]["w"] if "embed" in got else got["embed.w"]
        np.testing.assert_array_equal(np.asarray(leaf), TENSORS["embed.w"])


def test_a_snapshot_may_not_link_into_another_repositorys_blobs(tmp_path):
    snapshot = _hub_cache(tmp_path)
    other = tmp_path / "hub" / "models--someone--else" / "blobs"
    other.mkdir(parents=True)
    save_file({"embed.w": np.full((4, 3), 7, np.float32)}, str(other / "f00d"))
    (snapshot / FIRST).unlink()
    (snapshot / FIRST).symlink_to(os.path.relpath(other / "f00d", snapshot))
    _refused(snapshot, PathError, FIRST, "within the folder and the cache's blobs")
    plain = _write(tmp_path / "plain")  # no snapshot: ../blobs is outside
    (tmp_path / "blobs").mkdir()
    os.replace(plain / SECOND, tmp_path / "blobs" / "abc")
    (plain / SECOND).symlink_to("../blobs/abc")
    _refused(plain, PathError, SECOND, "outside the folder")


@pytest.mark.parametrize("slot", [INDEX, FIRST])
@pytest.mark.parametrize(
    ("make", "error", "expected"),
    [
        (os.mkfifo, PathError, "is a FIFO"),
        (os.mkdir, IsAFolderError, "is a folder, not a file"),
        (socket_at, PathError, "is a socket, not a file"),
        (lambda path: path.symlink_to(path.parent / "loop"), PathError, "a loop of links"),
    ],
    ids=["fifo", "folder", "socket", "loop"],
)
def test_a_special_file_in_a_files_place_is_refused_at_once(folder, slot, make, error, expected):
    (folder / slot).unlink()
    if "loop" in expected:
        (folder / "loop").symlink_to(folder / slot)
    make(folder / slot)
    _refused(folder, error, slot, expected)


def test_the_single_file_reader_refuses_a_fifo_and_a_device_at_once(tmp_path):
    os.mkfifo(tmp_path / "model.jxs")
    for target, expected in [(tmp_path / "model.jxs", "is a FIFO"), ("/dev/zero", "is a character device")]:
        with bounded(10), pytest.raises(PathError, match=expected):
            jaxstow.load(target)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"weight_map": {}}', "has an empty weight_map"),
        ('{"weight_map": {"embed.w": "model-00001-of-00002.safetensors\\u0000.txt"}}', r"maps to .*\\x00\.txt"),
        ('{"weight_map": {"embed.w": "\\ud800.safetensors"}}', "not a .safetensors file of the folder"),
        ('{"weight_map": {"embed.w": "../model-00001-of-00002.safetensors"}}', "not a .safetensors file of the folder"),
        ('{"weight_map": {"embed.w": "/tmp/model.safetensors"}}', "not a .safetensors file of the folder"),
        ('{"weight_map": {"embed.w": 1}}', "maps to 1, not a .safetensors file"),
        ('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}", "recursion"),
        ('{"metadata": {"n": ' + "9" * 5000 + '}, "weight_map": {}}', "4300 digits"),
        ('{"metadata": {"l": [' + ",".join(["0"] * (MAX_FOLDER_TENSORS + 300)) + "]}}", "more entries than"),
        ("", "not valid JSON"),
        (
            '{"weight_map": {"embed.w": "model-00002-of-00002.safetensors", "head.b": "model-00002-of-00002.safetensors",'
            ' "embed.w": "model-00001-of-00002.safetensors"}}',
            "gives 'embed.w' twice",
        ),
    ],
    ids=[
        "empty",
        "NUL",
        "surrogate",
        "climbs out",
        "absolute",
        "number",
        "deep",
        "huge integer",
        "entries",
        "blank",
        "twice",
    ],
)
def test_a_malformed_index_is_a_format_error_naming_it(folder, text, expected):
    (folder / INDEX).write_text(text)
    _refused(folder, FormatError, INDEX, expected)


def test_an_index_of_one_tensor_more_than_a_folder_may_hold_is_refused(folder):
    entries = ",".join(f'"e{number:x}": "{FIRST}"' for number in range(MAX_FOLDER_TENSORS + 1))
    (folder / INDEX).write_text('{"weight_map": {' + entries + "}}")
    with pytest.raises(FormatError, match=f"maps {MAX_FOLDER_TENSORS + 1} tensors, more than the {MAX_FOLDER_TENSORS}"):
        jaxstow.open(folder)


def test_an_index_past_its_size_is_refused_before_it_is_read(folder):
    with open(folder / INDEX, "r+b") as index:
        index.truncate(MAX_INDEX_BYTES + 1)  # sparse: nothing is written
    tracemalloc.start()
    try:
        _refused(folder, FormatError, INDEX, f"is {MAX_INDEX_BYTES + 1} bytes, more than the {MAX_INDEX_BYTES}")
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("index", [True, False])
def test_a_jaxstow_file_in_a_shards_place_never_stands_for_the_folder(tmp_path, index):
    folder = _write(tmp_path / "hf", index=index)
    (folder / FIRST).unlink()
    jaxstow.save(folder / FIRST, {"embed.w": jnp.full((4, 3), 7.0)})  # a whole tree, named like the shard
    error, expected = (FormatError, "is a jaxstow file") if index else (IsAFolderError, r"\(a jaxstow file\)")
    _refused(folder, error, FIRST, expected)


def test_an_npz_in_a_safetensors_slot_is_refused(folder):
    with open(folder / FIRST, "wb") as file:
        np.savez(file, **{"embed.w": TENSORS["embed.w"]})
    _refused(folder, FormatError, FIRST, "is a zip archive")


def test_a_tensor_held_by_two_shards_is_refused(folder):
    save_file(TENSORS, str(folder / SECOND))  # the index maps embed.w to the first file only
    _refused(folder, FormatError, SECOND, f"is also in {folder / FIRST}")


def test_a_header_of_too_many_tensors_is_refused_before_it_is_parsed(folder):
    extra = "".join(
        f'"e{number:x}":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}},' for number in range(MANY_TENSORS)
    )
    shard = safetensors_bytes({"head.b": TENSORS["head.b"]}, extra)
    (folder / SECOND).write_bytes(shard)
    tracemalloc.start()
    try:
        with bounded(10), pytest.raises(FormatError) as refused:
            jaxstow.open(folder)
        assert tracemalloc.get_traced_memory()[1] < 3 * len(shard) + (16 << 20)  # the text read, never parsed
    finally:
        tracemalloc.stop()
    before = len(TENSORS) - 1  # the first shard's tensors, read before the second's
    assert (
        f"its header of up to {MANY_TENSORS + 1} tensors, with the {before} tensors of the folder's files before it, is "
        f"more than the {MAX_FOLDER_TENSORS} a folder may hold (a file this large loads on its own: jaxstow.load("
    ) in str(refused.value)


@pytest.mark.parametrize("value", ["[]", "0", '""'])
def test_a_header_of_values_that_are_no_tensors_is_charged_for_them_before_it_is_parsed(folder, value):
    count = MAX_FOLDER_TENSORS * VALUES_PER_TENSOR + 1  # values, not entries: lists, numbers, strings
    extra = '"x":[' + ",".join([value] * count) + "],"
    shard = safetensors_bytes({"head.b": TENSORS["head.b"]}, extra)
    (folder / SECOND).write_bytes(shard)
    tracemalloc.start()
    try:
        with bounded(10), pytest.raises(FormatError, match=f"more than the {MAX_FOLDER_TENSORS} a folder may hold"):
            jaxstow.open(folder)
        assert tracemalloc.get_traced_memory()[1] < 3 * len(shard) + (16 << 20)  # the text read, never parsed
    finally:
        tracemalloc.stop()


def test_headers_past_what_a_folder_may_take_are_refused_before_they_are_read(folder):
    (folder / SECOND).write_bytes(struct.pack("<Q", MAX_FOLDER_HEADER_BYTES + 1) + b"{")
    _refused(folder, FormatError, SECOND, f"more than the {MAX_FOLDER_HEADER_BYTES} bytes the headers")


def test_a_folder_on_s3_is_checked_as_a_local_one(s3_server, tmp_path):
    import fsspec

    local = _write(tmp_path / "hf")
    (local / SECOND).unlink()
    jaxstow.save(local / SECOND, {"head.b": jnp.zeros(3, jnp.int32)})
    url = s3_server.url("hostile-folder")
    fs, root = fsspec.core.url_to_fs(url, **s3_server.storage_options)
    for path in local.iterdir():
        fs.put_file(str(path), f"{root}/{path.name}")
    with pytest.raises(FormatError, match=f"{SECOND}: is a jaxstow file"):
        jaxstow.load(url, storage_options=s3_server.storage_options)
    fs.pipe_file(f"{root}/{SECOND}", struct.pack("<Q", MAX_FOLDER_HEADER_BYTES + 1) + b"{")
    with pytest.raises(FormatError, match=f"{SECOND}: its header of {MAX_FOLDER_HEADER_BYTES + 1} bytes"):
        jaxstow.load(url, storage_options=s3_server.storage_options)
    fs.pipe_file(f"{root}/{INDEX}", b'{"weight_map": {"embed.w": "../x.safetensors"}}')
    with pytest.raises(FormatError, match=f"{INDEX}: maps to '../x.safetensors'"):
        jaxstow.open(url, storage_options=s3_server.storage_options)


@pytest.mark.parametrize("command", ["inspect", "verify", "ls"])
def test_the_command_refuses_a_hostile_folder_in_one_line(tmp_path, command):
    fifo = _write(tmp_path / "fifo")
    (fifo / INDEX).unlink()
    os.mkfifo(fifo / INDEX)
    linked = _write(tmp_path / "linked")
    (linked / FIRST).unlink()
    (linked / FIRST).symlink_to("/dev/zero")
    for target, expected in [(fifo, f"{INDEX}: is a FIFO"), (linked, f"{FIRST}: is a link to /dev/zero")]:
        done = forked.run(
            [sys.executable, "-m", "jaxstow", command, str(target)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
        assert done.stderr.startswith(f"jaxstow {command}: ") and expected in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1
