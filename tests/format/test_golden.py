"""Golden files: a file of every format version ever written, kept forever, and the bytes the writer writes now.

``tests/data/format_v{N}.jxs`` and ``.npz`` hold the tree of ``format_trees.expected`` as format version ``N`` wrote
it: version 1 by the last writer of version 1 (the commit before ``format version 2``), versions 2 to 4 by jaxstow
at each version. ``tests/data/checkpoint_v4`` is a checkpoint folder (two steps) as ``CheckpointManager`` writes it.

Every golden file must load to the known tree forever. The writer, given the golden trees, must write exactly the
bytes of the current version's golden files (npz members' timestamps, and the checkpoint record's time and library
version, aside): a change to the bytes is a change of the format, which needs a new format version and new golden
files (see ``docs/format.md``, "Versions").
"""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import zipfile
from pathlib import Path

import jax
import numpy as np
import pytest
from format_trees import assert_same, expected, golden_tree, metadata

import jaxstow
from jaxstow._format.manifest import FORMAT_VERSION
from reliability.forge import split_native

DATA = Path(__file__).parents[1] / "data"
GOLDEN = sorted(path.name for path in DATA.glob("format_v*.*"))
CHECKPOINT = DATA / f"checkpoint_v{FORMAT_VERSION}"

BUMP = (
    "the writer no longer writes the bytes of {golden}, so the file format changed. If that is meant, bump "
    "FORMAT_VERSION in src/jaxstow/_format/manifest.py, say what the new version adds in docs/format.md (Versions), "
    "make the reader read both, and add golden files written by the new writer (format_trees.golden_tree saved with "
    "format_trees.metadata(version), and a checkpoint folder), keeping the old ones: they must load forever. {detail}"
)


def _version(name: str) -> int:
    match = re.fullmatch(r"format_v(\d+)\.(jxs|npz)", name)
    assert match, f"{name}: golden files are named format_v<version>.jxs or .npz"
    return int(match.group(1))


def test_every_format_version_has_golden_files_in_both_containers():
    for suffix in (".jxs", ".npz"):
        versions = sorted(_version(name) for name in GOLDEN if name.endswith(suffix))
        assert versions == list(range(1, FORMAT_VERSION + 1)), suffix
    assert (CHECKPOINT / "3" / "checkpoint.json").is_file()


def _manifest_version(path: Path) -> int:
    if path.suffix == ".npz":
        with zipfile.ZipFile(path) as archive:
            member = np.load(io.BytesIO(archive.read("__jaxstow__.npy")), allow_pickle=False)
        return int(json.loads(member.tobytes())["version"])
    _, text, _ = split_native(path.read_bytes())
    assert text is not None
    return int(json.loads(text)["version"])


@pytest.mark.parametrize("name", GOLDEN)
def test_a_golden_file_loads_to_the_known_tree(name):
    path = DATA / name
    assert _manifest_version(path) == _version(name)
    tree = expected(sharded=name.endswith(".jxs"))
    assert_same(jaxstow.load(path, as_numpy=True), tree)
    assert jaxstow.load_metadata(path)["epoch"] == 3
    assert_same(jaxstow.load(path, like=tree, as_numpy=True), tree)
    assert_same(jaxstow.load(path, select=["params/**"], as_numpy=True), {"params": tree["params"]})
    restored = jaxstow.load(path)
    assert isinstance(restored["params"]["w"], jax.Array)
    with jaxstow.open(path) as reader:
        np.testing.assert_array_equal(reader["int4"], tree["int4"])
        assert reader.info("c128").dtype == np.complex128
        np.testing.assert_array_equal(reader.read("params/w", np.s_[1:, 2]), tree["params"]["w"][1:, 2])


def _first_difference(found: bytes, golden: bytes) -> str:
    at = next((i for i, (a, b) in enumerate(zip(found, golden, strict=False)) if a != b), min(len(found), len(golden)))
    return (
        f"They first differ at byte {at} (now {found[max(0, at - 40) : at + 40]!r}, golden "
        f"{golden[max(0, at - 40) : at + 40]!r}); {len(found)} bytes now, {len(golden)} golden."
    )


def _without_zip_times(data: bytes) -> bytes:
    """An archive's bytes with the modification time and date of every member zeroed (local headers and central
    directory): zipfile stamps each member with the time it is written."""
    out = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
        for info in infos:
            assert out[info.header_offset : info.header_offset + 4] == b"PK\x03\x04"
            out[info.header_offset + 10 : info.header_offset + 14] = bytes(4)
        at = archive.start_dir
        for _ in infos:
            assert out[at : at + 4] == b"PK\x01\x02"
            out[at + 12 : at + 16] = bytes(4)
            name, extra, comment = struct.unpack_from("<3H", out, at + 28)
            at += 46 + name + extra + comment
    return bytes(out)


@pytest.mark.parametrize("suffix", [".jxs", ".npz"])
def test_the_writer_writes_the_bytes_of_the_current_golden_files(tmp_path, suffix):
    golden = DATA / f"format_v{FORMAT_VERSION}{suffix}"
    path = tmp_path / f"now{suffix}"
    jaxstow.save(path, golden_tree(sharded=suffix == ".jxs"), metadata=metadata(FORMAT_VERSION))
    found, wanted = path.read_bytes(), golden.read_bytes()
    if suffix == ".npz":
        found, wanted = _without_zip_times(found), _without_zip_times(wanted)
    assert found == wanted, BUMP.format(golden=golden.name, detail=_first_difference(found, wanted))


def _checkpoint_items() -> dict[int, object]:
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
    return {3: {"params": params, "state": {"step": np.int64(3), "lr": 0.1}}, 5: [np.arange(4, dtype=np.int32), 2.5]}


def _save_checkpoint(folder: Path) -> None:
    """The saves that wrote ``tests/data/checkpoint_v<FORMAT_VERSION>``."""
    items = _checkpoint_items()
    with jaxstow.CheckpointManager(folder, keep=jaxstow.KeepPolicy(keep_last=2)) as manager:
        manager.save(3, items[3], metrics={"loss": 0.25}, metadata={"epoch": 3})
        manager.save(5, items[5], metrics={"loss": float("nan")})


def _files(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


def test_the_golden_checkpoint_restores_and_verifies(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(CHECKPOINT, folder)
    items = _checkpoint_items()
    with jaxstow.CheckpointManager(folder, keep=jaxstow.KeepPolicy(keep_last=2)) as manager:
        assert manager.steps() == [3, 5]
        assert manager.damaged_steps() == {}
        assert_same(manager.restore(3, as_numpy=True), items[3])
        assert_same(manager.restore(5, as_numpy=True), items[5])
        assert manager.metrics(5) == {"loss": None}


def test_the_checkpoint_writer_writes_the_golden_checkpoint(tmp_path):
    folder = tmp_path / "run"
    _save_checkpoint(folder)
    assert _files(folder) == _files(CHECKPOINT), BUMP.format(golden=CHECKPOINT.name, detail="Other files.")
    varying = ("time", "library", "record_xxh3")  # when and by which release it was written, and what that changes
    for name in _files(folder):
        found, wanted = (folder / name).read_bytes(), (CHECKPOINT / name).read_bytes()
        if name.endswith("checkpoint.json"):
            record, golden = json.loads(found), json.loads(wanted)
            assert list(record) == list(golden), BUMP.format(golden=name, detail="Other keys, or in another order.")
            for key in varying:
                record.pop(key), golden.pop(key)
            assert record == golden, BUMP.format(golden=name, detail=f"{record} != {golden}")
        else:
            assert found == wanted, BUMP.format(golden=name, detail=_first_difference(found, wanted))
