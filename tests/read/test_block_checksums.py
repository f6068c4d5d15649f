"""Slices and parts of shards are verified block by block: a flipped byte in what a slice reads is a CorruptFileError
naming the file and leaf, whatever the slice, the source (a local file, a memory map, a file object, S3) or the layout
it is restored onto; bytes it does not touch do not stop it; malformed block checksums are a FormatError."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import fsspec
import jax
import numpy as np
import pytest
from distributed_runs import launch, reports
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow._format.block_checksums import BLOCK_BYTES
from jaxstow._read import block_verified
from jaxstow._read.verifying import verify_checksums
from jaxstow.errors import CorruptFileError, FormatError
from reliability.forge import forge_native, split_native

ROWS, COLUMNS = 1000, 1500  # 6 MB of float32: 6 blocks, rows of 6,000 bytes that straddle block boundaries
MATRIX = np.arange(ROWS * COLUMNS, dtype=np.float32).reshape(ROWS, COLUMNS)
BLOCK_ROW = BLOCK_BYTES // (COLUMNS * 4)  # the first row that block 1 holds a byte of (row 174)


def _flipped(data: bytes, tensor: str, at: int) -> bytes:
    """``data`` (a native file) with one bit of byte ``at`` of ``tensor``'s bytes flipped."""
    (length,) = struct.unpack("<Q", data[:8])
    start = 8 + length + json.loads(data[8 : 8 + length])[tensor]["data_offsets"][0]
    damaged = bytearray(data)
    damaged[start + at] ^= 0x10
    return bytes(damaged)


@pytest.fixture
def damaged(tmp_path):
    """A file whose matrix has one flipped bit in its block 3 (rows 523 to 698)."""
    jaxstow.save(tmp_path / "model.jxs", {"w": MATRIX, "b": np.ones(3)})
    path = tmp_path / "damaged.jxs"
    path.write_bytes(_flipped((tmp_path / "model.jxs").read_bytes(), "w", 3 * BLOCK_BYTES + 1001))
    return path


@pytest.mark.parametrize("opening", ["path", "mmap", "file object"])
def test_a_slice_touching_a_damaged_block_is_refused_and_one_beside_it_is_read(damaged, opening):
    source = io.BytesIO(damaged.read_bytes()) if opening == "file object" else damaged
    with jaxstow.open(source, mmap=opening == "mmap") as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[:100]), MATRIX[:100])
        np.testing.assert_array_equal(reader.read("w", np.s_[720:, ::7]), MATRIX[720:, ::7])
        for index in (np.s_[600], np.s_[500:700, 3:5], np.s_[:, 1400], np.s_[..., 10:11], np.s_[::-1]):
            with pytest.raises(CorruptFileError, match=r"leaf 'w' of (.*damaged\.jxs|<BytesIO>): checksum mismatch"):
                reader.read("w", index)
        with pytest.raises(CorruptFileError, match="leaf 'w'"):
            reader.read("w")


def test_a_slice_from_s3_is_verified(s3_server, damaged):
    url = s3_server.url("blocks/damaged.jxs")
    with fsspec.open(url, "wb", **s3_server.storage_options) as remote:
        remote.write(damaged.read_bytes())
    with jaxstow.open(url, storage_options=s3_server.storage_options) as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[10:20]), MATRIX[10:20])
        with pytest.raises(CorruptFileError, match="checksum mismatch in bytes"):
            reader.read("w", np.s_[690:700])


def test_every_slice_reads_exactly_its_elements_and_is_refused_exactly_when_it_touches_damage(tmp_path, monkeypatch):
    monkeypatch.setattr(block_verified, "_SCRATCH", 3 * BLOCK_BYTES)  # parts of many ranges read in pieces too
    shape = (5, 40, 3000)
    array = np.random.default_rng(0).integers(-1000, 1000, shape).astype(np.int32)  # 2.4 MB: 3 blocks
    jaxstow.save(tmp_path / "model.jxs", {"x": array})
    good = (tmp_path / "model.jxs").read_bytes()
    offsets = np.arange(array.size).reshape(shape) * 4
    rng = np.random.default_rng(1)
    for round in range(60):
        index = tuple(
            slice(start, int(rng.integers(start + 1, n + 1))) for n in shape for start in [int(rng.integers(n))]
        )
        flipped_at = int(rng.integers(array.nbytes))
        path = tmp_path / f"{round}.jxs"
        path.write_bytes(_flipped(good, "x", flipped_at))
        read = offsets[index].reshape(-1)
        touched = set((read // BLOCK_BYTES).tolist()) | set(((read + 3) // BLOCK_BYTES).tolist())
        with jaxstow.open(path) as reader:
            if flipped_at // BLOCK_BYTES in touched:
                with pytest.raises(CorruptFileError, match="leaf 'x'"):
                    reader.read("x", index)
            else:
                np.testing.assert_array_equal(reader.read("x", index), array[index])
        path.unlink()


def test_a_part_of_a_damaged_shard_is_refused_when_read_or_restored_onto_another_layout(tmp_path):
    devices = np.array(jax.devices()[:2])
    rows = NamedSharding(Mesh(devices, ("x",)), P("x", None))
    jaxstow.save(tmp_path / "model.jxs", {"w": jax.device_put(MATRIX, rows)})
    good = (tmp_path / "model.jxs").read_bytes()
    path = tmp_path / "damaged.jxs"
    path.write_bytes(_flipped(good, "w@500:1000,0:1500", 2 * BLOCK_BYTES + 9))  # rows 849 to 849 + 174
    with jaxstow.open(path) as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[400:700, 3]), MATRIX[400:700, 3])
        with pytest.raises(CorruptFileError, match=r"leaf 'w' of .*damaged\.jxs: checksum mismatch in bytes"):
            reader.read("w", np.s_[840:900, 3])
        with pytest.raises(CorruptFileError, match="leaf 'w'"):
            reader.read("w", np.s_[750:1000])


def test_files_written_before_block_checksums_still_read_slices(tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"w": MATRIX})
    tensors, manifest_text, data = split_native((tmp_path / "model.jxs").read_bytes())
    manifest = json.loads(manifest_text or "")
    del manifest["blocks"]
    (tmp_path / "older.jxs").write_bytes(forge_native(tensors, json.dumps(manifest), data))
    with jaxstow.open(tmp_path / "older.jxs") as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[3:900, 7]), MATRIX[3:900, 7])


@pytest.mark.parametrize(
    "blocks",
    [
        {"0": "0123456789abcdef"},  # one checksum for six blocks
        {"0": "g" * 96},
        {"0": "0" * 95},
        {"0": 7},
        {"0": ["0" * 16] * 6},
        "0" * 96,
    ],
)
def test_malformed_block_checksums_are_a_format_error(tmp_path, blocks):
    jaxstow.save(tmp_path / "model.jxs", {"w": MATRIX})
    tensors, manifest_text, data = split_native((tmp_path / "model.jxs").read_bytes())
    manifest = json.loads(manifest_text or "")
    manifest["blocks"] = blocks
    (tmp_path / "forged.jxs").write_bytes(forge_native(tensors, json.dumps(manifest), data))
    with pytest.raises(FormatError, match=r"forged\.jxs"), jaxstow.open(tmp_path / "forged.jxs") as reader:
        reader.read("w", np.s_[5:7])


def test_block_checksums_are_written_for_tensors_of_more_than_one_block_only(tmp_path):
    tree = {"small": np.ones(BLOCK_BYTES // 4, np.float32), "large": np.ones(BLOCK_BYTES // 4 + 1, np.float32)}
    jaxstow.save(tmp_path / "model.jxs", tree)
    manifest = json.loads(split_native((tmp_path / "model.jxs").read_bytes())[1] or "")
    large = str(manifest["paths"].index("large"))
    assert list(manifest["blocks"]) == [large] and len(manifest["blocks"][large]) == 2 * 16


def test_a_restore_in_two_processes_onto_another_layout_refuses_a_damaged_block_of_a_shard_each_reads_a_part_of(
    tmp_path,
):
    worker = Path(__file__).parents[1] / "distributed" / "blocks_worker.py"

    def run(action: str) -> list[dict]:
        return reports(launch(worker, 2, lambda index, port: [action, str(index), "2", str(port), str(tmp_path)]))

    run("save")
    assert run("restore") == [{"shards": 1}, {"shards": 1}]  # every process read a part of both shards, verified
    damaged = tmp_path / "1" / "w.p1.safetensors"  # item "w", the array itself: its second process's rows
    damaged.write_bytes(_flipped(damaged.read_bytes(), "@1024:2048,0:1024", 2 * BLOCK_BYTES + 5))
    for report in run("restore"):
        assert "CorruptFileError" in report["error"] and damaged.name in report["error"], report


def test_verify_finds_block_checksums_that_do_not_match_bytes_its_whole_checksum_finds_intact(tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"w": MATRIX})
    tensors, manifest_text, data = split_native((tmp_path / "model.jxs").read_bytes())
    manifest = json.loads(manifest_text or "")
    [(leaf, blocks)] = manifest["blocks"].items()
    manifest["blocks"][leaf] = blocks[16:32] + blocks[:16] + blocks[32:]  # two blocks' checksums swapped
    (tmp_path / "forged.jxs").write_bytes(forge_native(tensors, json.dumps(manifest), data))
    with jaxstow.open(tmp_path / "forged.jxs") as reader:
        checked, damage = verify_checksums(reader, lambda nbytes: None)
        assert checked == 1
        with pytest.raises(CorruptFileError, match="block 0"):
            reader.read("w", np.s_[:3])
    assert [(error.path, "block checksums do not match" in str(error)) for error in damage] == [("w", True)]
