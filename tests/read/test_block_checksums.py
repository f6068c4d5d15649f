"""Parts of tensors are verified block by block where that reads little more than they need: a flipped byte in what
such a slice, or part of a shard, reads is a CorruptFileError naming the file and leaf, whatever the source (a local
file, a memory map, a file object, S3) or the layout it is restored onto; bytes it does not touch do not stop it; a
narrow slice still reads only its bytes; malformed block checksums are a FormatError."""

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
from jaxstow._format.block_checksums import BLOCK_BYTES, Checksums
from jaxstow._read import block_verified
from jaxstow._read.verifying import verify_checksums
from jaxstow._storage.opening import open_source
from jaxstow.errors import CorruptFileError, FormatError
from reliability.forge import forge_native, split_native

ROWS, COLUMNS = 2048, 4096  # 32 MiB of float32 in rows of 16 KiB: 64 rows a block
MATRIX = np.arange(ROWS * COLUMNS, dtype=np.float32).reshape(ROWS, COLUMNS)
PER_BLOCK = BLOCK_BYTES // (COLUMNS * 4)


def _flipped(data: bytes, tensor: str, at: int) -> bytes:
    """``data`` (a native file) with one bit of byte ``at`` of ``tensor``'s bytes flipped."""
    (length,) = struct.unpack("<Q", data[:8])
    start = 8 + length + json.loads(data[8 : 8 + length])[tensor]["data_offsets"][0]
    damaged = bytearray(data)
    damaged[start + at] ^= 0x10
    return bytes(damaged)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """A file whose matrix has one flipped bit in its block 20 (rows 1280 to 1343)."""
    folder = tmp_path_factory.mktemp("blocks")
    jaxstow.save(folder / "model.jxs", {"w": MATRIX, "b": np.ones(3)})
    path = folder / "damaged.jxs"
    path.write_bytes(_flipped((folder / "model.jxs").read_bytes(), "w", 20 * BLOCK_BYTES + 1001))
    return path


@pytest.mark.parametrize("opening", ["path", "mmap", "file object"])
def test_a_slice_of_whole_blocks_touching_a_damaged_one_is_refused_and_one_beside_it_is_read(damaged, opening):
    source = io.BytesIO(damaged.read_bytes()) if opening == "file object" else damaged
    with jaxstow.open(source, mmap=opening == "mmap") as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[: 20 * PER_BLOCK]), MATRIX[: 20 * PER_BLOCK])
        np.testing.assert_array_equal(reader.read("w", np.s_[21 * PER_BLOCK :]), MATRIX[21 * PER_BLOCK :])
        for index in (np.s_[20 * PER_BLOCK : 21 * PER_BLOCK], np.s_[5:1900], np.s_[960:1728, 3:4000], np.s_[::-1]):
            with pytest.raises(CorruptFileError, match=r"leaf 'w' of (.*damaged\.jxs|<BytesIO>): checksum mismatch"):
                reader.read("w", index)


@pytest.mark.parametrize("opening", ["path", "mmap"])
def test_a_part_too_narrow_to_verify_whole_still_verifies_the_blocks_it_holds_whole(damaged, opening):
    # rows 1250 to 1359 hold block 20 whole and blocks 19 and 21 in part: verifying all three would read 1.7 times
    # its bytes, so it was read unverified, the damaged block's values returned
    with jaxstow.open(damaged, mmap=opening == "mmap") as reader:
        with pytest.raises(CorruptFileError, match=r"checksum mismatch in bytes .* \(block 20"):
            reader.read("w", np.s_[1250:1360])
        np.testing.assert_array_equal(reader.read("w", np.s_[1100:1270]), MATRIX[1100:1270])  # 18 whole, intact


def test_a_damaged_block_names_its_bytes(damaged):
    with jaxstow.open(damaged) as reader, pytest.raises(CorruptFileError) as raised:
        reader.read("w", np.s_[960:1408])
    start = 20 * BLOCK_BYTES
    assert f"checksum mismatch in bytes {start} to {start + BLOCK_BYTES} of the leaf (block 20" in str(raised.value)


def test_a_narrow_slice_reads_only_its_bytes(damaged):
    def read_bytes() -> int:
        with open("/proc/self/io") as counters:
            return next(int(line.split()[1]) for line in counters if line.startswith("rchar:"))

    with jaxstow.open(damaged) as reader:
        before = read_bytes()
        row = reader.read("w", np.s_[1290])  # one row of the damaged block: read as it is, as before
        assert read_bytes() - before < 4 * COLUMNS * 4
    assert row.shape == (COLUMNS,)


def test_a_slice_from_s3_is_verified(s3_server, damaged):
    url = s3_server.url("blocks/damaged.jxs")
    with fsspec.open(url, "wb", **s3_server.storage_options) as remote:
        remote.write(damaged.read_bytes())
    with jaxstow.open(url, storage_options=s3_server.storage_options) as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[64:1280]), MATRIX[64:1280])
        with pytest.raises(CorruptFileError, match="checksum mismatch in bytes"):
            reader.read("w", np.s_[64:1344])


def test_every_part_reads_exactly_its_elements_and_is_refused_exactly_when_it_touches_damage(monkeypatch):
    monkeypatch.setattr(block_verified, "_SCRATCH", 3 * BLOCK_BYTES)  # parts of many ranges read in pieces too
    rng = np.random.default_rng(1)
    for shape in [(1200, 1000), (5, 3, 100000), (3_100_000,)]:
        array = rng.integers(-1000, 1000, shape).astype(np.float32 if len(shape) < 3 else np.int16)
        good = array.tobytes()
        blocks = "".join(Checksums.of(memoryview(good))[1] or [])
        offsets = np.arange(array.size).reshape(shape) * array.itemsize
        for _ in range(25):
            box = tuple((start, int(rng.integers(start + 1, n + 1))) for n in shape for start in [int(rng.integers(n))])
            read = offsets[tuple(slice(start, stop) for start, stop in box)].reshape(-1)
            touched = set((read // BLOCK_BYTES).tolist()) | set(((read + array.itemsize - 1) // BLOCK_BYTES).tolist())
            flipped = bytearray(good)
            at = int(rng.integers(len(good)))
            flipped[at] ^= 4
            source = open_source(io.BytesIO(bytes(flipped)))
            arguments = (source, 0, array.dtype, shape, box, blocks)
            if at // BLOCK_BYTES in touched:
                with pytest.raises(CorruptFileError, match="leaf 'p' of f"):
                    block_verified.read_verified_box(*arguments, file="f", path="p")
            else:
                part = block_verified.read_verified_box(*arguments, file="f", path="p")
                np.testing.assert_array_equal(part, array[tuple(slice(start, stop) for start, stop in box)])


def test_a_part_of_a_damaged_shard_is_refused(tmp_path):
    rows = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("x",)), P("x", None))
    jaxstow.save(tmp_path / "model.jxs", {"w": jax.device_put(MATRIX, rows)})
    path = tmp_path / "damaged.jxs"
    path.write_bytes(_flipped((tmp_path / "model.jxs").read_bytes(), "w@1024:2048,0:4096", 9 * BLOCK_BYTES + 9))
    with jaxstow.open(path) as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[400:1600]), MATRIX[400:1600])  # blocks 0-8 of it
        with pytest.raises(CorruptFileError, match=r"leaf 'w' of .*damaged\.jxs: checksum mismatch in bytes"):
            reader.read("w", np.s_[400:1700])
        with pytest.raises(CorruptFileError, match=r"leaf 'w' of .*damaged\.jxs: checksum mismatch in bytes"):
            reader.read("w", np.s_[1570:1700])  # holds the shard's block 9 whole, 1.5 blocks beside it in part


def test_a_restore_in_three_processes_of_a_step_saved_by_two_refuses_a_damaged_block_one_of_them_reads(tmp_path):
    worker = Path(__file__).parents[1] / "distributed" / "blocks_worker.py"

    def run(action: str, count: int) -> list[dict]:
        arguments = lambda index, port: [action, str(index), str(count), str(port), str(tmp_path)]  # noqa: E731
        return reports(launch(worker, count, arguments))

    run("save", 2)
    assert run("restore", 3) == [{"shards": 1}] * 3  # the middle process read a part of each saved shard, verified
    damaged = tmp_path / "1" / "w.p1.safetensors"  # item "w", the array itself: its second process's rows
    damaged.write_bytes(_flipped(damaged.read_bytes(), "@1536:3072,0:1024", BLOCK_BYTES + 5))  # rows 1792 to 2047
    found = run("restore", 3)
    assert "CorruptFileError" in found[1]["error"] and damaged.name in found[1]["error"], found
    assert all("error" in report for report in found), found  # no process goes on with a part of the tree


def test_files_written_before_block_checksums_still_read_slices(tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"w": MATRIX})
    tensors, manifest_text, data = split_native((tmp_path / "model.jxs").read_bytes())
    manifest = json.loads(manifest_text or "")
    del manifest["blocks"]
    (tmp_path / "older.jxs").write_bytes(forge_native(tensors, json.dumps(manifest), data))
    with jaxstow.open(tmp_path / "older.jxs") as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[3:900, 7]), MATRIX[3:900, 7])
        np.testing.assert_array_equal(reader.read("w", np.s_[3:1900]), MATRIX[3:1900])


def _forged(tmp_path, edit) -> Path:
    jaxstow.save(tmp_path / "model.jxs", {"w": MATRIX})
    tensors, manifest_text, data = split_native((tmp_path / "model.jxs").read_bytes())
    manifest = json.loads(manifest_text or "")
    edit(manifest)
    (tmp_path / "forged.jxs").write_bytes(forge_native(tensors, json.dumps(manifest), data))
    return tmp_path / "forged.jxs"


@pytest.mark.parametrize(
    "blocks",
    [
        {"0": "0123456789abcdef"},  # one checksum for 32 blocks
        {"0": "g" * 512},
        {"0": "0" * 511},
        {"0": 7},
        {"0": ["0" * 16] * 32},
        {"0": None},  # read as "no block checksums": every part unverified
        "0" * 512,
    ],
)
def test_malformed_block_checksums_are_a_format_error(tmp_path, blocks):
    forged = _forged(tmp_path, lambda manifest: manifest.update(blocks=blocks))
    with pytest.raises(FormatError, match=r"forged\.jxs"), jaxstow.open(forged) as reader:
        reader.read("w", np.s_[5:7])


def test_a_shards_block_checksums_of_null_are_a_format_error(tmp_path):
    rows = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("x",)), P("x", None))
    jaxstow.save(tmp_path / "model.jxs", {"w": jax.device_put(MATRIX, rows)})
    tensors, manifest_text, data = split_native((tmp_path / "model.jxs").read_bytes())
    manifest = json.loads(manifest_text or "")
    (detail,) = manifest["details"].values()
    detail["shards"][1]["blocks"] = None  # read as "no block checksums": every part of the shard unverified
    (tmp_path / "forged.jxs").write_bytes(forge_native(tensors, json.dumps(manifest), data))
    with pytest.raises(FormatError, match=r"leaf 'w' of .*forged\.jxs: malformed block checksums null of a shard"):
        jaxstow.open(tmp_path / "forged.jxs").read("w", np.s_[1500:1600])


def test_verify_finds_block_checksums_that_do_not_match_bytes_its_whole_checksum_finds_intact(tmp_path):
    def swap(manifest):  # the first two blocks' checksums swapped
        blocks = manifest["blocks"]["0"]
        manifest["blocks"]["0"] = blocks[16:32] + blocks[:16] + blocks[32:]

    with jaxstow.open(_forged(tmp_path, swap)) as reader:
        checked, damage = verify_checksums(reader, lambda nbytes: None)
        assert checked == 1
        with pytest.raises(CorruptFileError, match="block 0"):
            reader.read("w", np.s_[: 2 * PER_BLOCK])
    assert [(error.path, "block checksums do not match" in str(error)) for error in damage] == [("w", True)]


def test_block_checksums_are_written_for_tensors_of_more_than_one_block_only(tmp_path):
    tree = {"small": np.ones(BLOCK_BYTES // 4, np.float32), "large": np.ones(BLOCK_BYTES // 4 + 1, np.float32)}
    jaxstow.save(tmp_path / "model.jxs", tree)
    manifest = json.loads(split_native((tmp_path / "model.jxs").read_bytes())[1] or "")
    large = str(manifest["paths"].index("large"))
    assert list(manifest["blocks"]) == [large] and len(manifest["blocks"][large]) == 2 * 16


SMALL = np.arange(1000, dtype=np.float32).reshape(100, 10)  # 4000 bytes: one block, checked by the leaf's own xxh3
NEARLY_WHOLE = (np.s_[1:], np.s_[:-1, :], np.s_[2:99])  # the slices that hold at least 95% of its bytes


@pytest.mark.parametrize("opening", ["path", "mmap", "file object"])
def test_a_slice_nearly_filling_a_leaf_of_one_block_is_verified_against_the_leaf_checksum(tmp_path, opening):
    jaxstow.save(tmp_path / "model.jxs", {"small": SMALL})
    damaged = tmp_path / "damaged.jxs"
    damaged.write_bytes(_flipped((tmp_path / "model.jxs").read_bytes(), "small", 50 * 40 + 1))  # in row 50
    source = io.BytesIO(damaged.read_bytes()) if opening == "file object" else damaged
    with jaxstow.open(source, mmap=opening == "mmap") as reader:
        for index in NEARLY_WHOLE:
            with pytest.raises(
                CorruptFileError, match=r"leaf 'small' of (.*damaged\.jxs|<BytesIO>): checksum mismatch"
            ):
                reader.read("small", index)  # was the damaged row, unverified
        np.testing.assert_array_equal(reader.read("small", np.s_[51:]), SMALL[51:])  # narrower: read as it is
    with jaxstow.open(tmp_path / "model.jxs", mmap=opening == "mmap") as reader:
        for index in NEARLY_WHOLE:
            np.testing.assert_array_equal(reader.read("small", index), SMALL[index])


def test_a_part_nearly_filling_a_shard_of_one_block_is_verified_against_the_shard_checksum(tmp_path):
    rows = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("x",)), P("x", None))
    whole = np.concatenate([SMALL, SMALL + 1000])
    jaxstow.save(tmp_path / "model.jxs", {"w": jax.device_put(whole, rows)})
    path = tmp_path / "damaged.jxs"
    path.write_bytes(_flipped((tmp_path / "model.jxs").read_bytes(), "w@100:200,0:10", 50 * 40 + 1))
    with jaxstow.open(path) as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[:99]), whole[:99])  # the first shard's
        with pytest.raises(CorruptFileError, match=r"leaf 'w' of .*damaged\.jxs: checksum mismatch"):
            reader.read("w", np.s_[101:])
