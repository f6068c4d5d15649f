"""The vectorised checks of format version 3: a safetensors header checked as columns, the manifest's columns, and
tensors read by columns (coalesced, in parallel pieces), each refusing what the per-entry checks refuse."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import jaxstow
from jaxstow._format import tensor_reads
from jaxstow._format.header import SlotTable, slot_table
from jaxstow._format.source import Parallel
from jaxstow._format.tensor_reads import read_tensors
from jaxstow._storage.opening import open_source
from jaxstow.errors import CorruptFileError, FormatError
from reliability.forge import forge_native, split_native


def _many(count: int = 300) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {f"layer_{i:03d}": {"w": rng.standard_normal((3, 5)).astype(np.float32)} for i in range(count)}


def _file(tree: object) -> bytes:
    buffer = io.BytesIO()
    jaxstow.save(buffer, tree)
    return buffer.getvalue()


def test_a_well_formed_header_becomes_the_same_slots_as_the_entry_by_entry_checks():
    tensors, _, data = split_native(_file(_many()))
    table = slot_table(tensors, data_start=4096, file_size=4096 + len(data))
    assert isinstance(table, SlotTable) and len(table) == 300
    slot = table["layer_007/w"]
    assert slot.dtype == np.float32 and slot.shape == (3, 5) and slot.nbytes == 60
    assert slot.offset == 4096 + tensors["layer_007/w"]["data_offsets"][0]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("data_offsets", [0, True]),
        ("data_offsets", [0.0, 60]),
        ("data_offsets", [0, 2**64]),
        ("data_offsets", [60, 0]),
        ("data_offsets", [0, 60, 0]),
        ("shape", [3, -5]),
        ("shape", [2**62, 2**62]),
        ("shape", [False, 5]),
        ("shape", "3x5"),
        ("dtype", "F31"),
        ("dtype", ["F32"]),
    ],
)
def test_any_malformed_entry_leaves_the_columns_to_the_entry_checks_which_name_it(field, value):
    tensors, manifest, data = split_native(_file(_many(3)))
    tensors["layer_001/w"][field] = value
    assert slot_table(tensors, data_start=4096, file_size=4096 + len(data)) is None
    with pytest.raises(FormatError, match="leaf 'layer_001/w'"):
        jaxstow.load(io.BytesIO(forge_native(tensors, manifest, data)))


def test_overlapping_or_holed_tensors_are_refused():
    tensors, manifest, data = split_native(_file(_many(3)))
    first, second = (tensors[name]["data_offsets"] for name in ("layer_000/w", "layer_001/w"))
    first[0], first[1], second[0], second[1] = second[0], second[1], first[0], first[1]  # swapped: still tiled
    assert slot_table(tensors, data_start=4096, file_size=4096 + len(data)) is not None
    tensors["layer_002/w"]["data_offsets"] = [0, 60]  # on top of another
    assert slot_table(tensors, data_start=4096, file_size=4096 + len(data)) is None
    with pytest.raises(FormatError, match="must not overlap or leave holes"):
        jaxstow.load(io.BytesIO(forge_native(tensors, manifest, data)))


def _forged_columns(change) -> io.BytesIO:
    tensors, text, data = split_native(_file({"w": np.zeros(3, np.float32), "b": np.ones(2, np.float32), "n": 2}))
    assert text is not None
    manifest = json.loads(text)
    change(manifest)
    return io.BytesIO(forge_native(tensors, json.dumps(manifest), data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.update(kinds="aa"), "one letter per leaf"),
        (lambda m: m.update(kinds="aaz"), "one letter per leaf"),
        (lambda m: m.update(xxh3=m["xxh3"][:1]), "16 hex digits for each of its 2 stored leaves"),
        (lambda m: m["xxh3"].__setitem__(0, "X" * 16), "16 hex digits"),
        (lambda m: m.update(paths=["b", "b", "w"]), "lists this leaf twice"),
        (lambda m: m.update(paths=["b", 7, "w"]), "paths must be a list of strings"),
        (lambda m: m.update(details={"9": {"value": 1}}), "malformed detail '9'"),
        (lambda m: m.update(details={"01": {"value": 1}}), "malformed detail '01'"),
        (lambda m: m.update(blocks={"02": "0" * 16}), "malformed detail 'blocks 02'"),
        (lambda m: m.update(blocks={"+2": "0" * 16}), "malformed detail 'blocks \\+2'"),
        (lambda m: m.update(blocks={"3": "0" * 16}), "malformed detail 'blocks 3'"),
        (lambda m: m.update(details={}), "a value leaf needs its value"),
        (lambda m: m.update(kinds="kva"), "a key leaf needs its impl"),
        (lambda m: m["details"]["1"].update(value={"ref": "os.system"}), "os.system"),
        (lambda m: m.update(paths=["b", "n", "x"]), "the structure names leaf 2 'w', but the manifest's paths 'x'"),
    ],
)
def test_malformed_columns_are_format_errors(change, message):
    with pytest.raises((FormatError, jaxstow.errors.JaxstowError), match=message):
        jaxstow.load(_forged_columns(change))


def test_a_flipped_byte_among_many_small_leaves_names_its_leaf(tmp_path):
    path = tmp_path / "many.jxs"
    jaxstow.save(path, _many())
    tensors, _, _ = split_native(path.read_bytes())
    begin = tensors["layer_123/w"]["data_offsets"][0]
    data = bytearray(path.read_bytes())
    data[8 + int.from_bytes(data[:8], "little") + begin + 7] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="layer_123/w"):
        jaxstow.load(path)
    with jaxstow.open(path) as reader:
        np.testing.assert_array_equal(reader["layer_122/w"], _many()["layer_122"]["w"])


def test_reads_in_parallel_pieces_and_coalesced_runs_give_every_tensor_and_its_digest(tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_reads, "_RUN", 3000)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(size).astype(np.float32) for size in (0, 5, 3000, 700, 1, 20_000, 0, 64)]
    path = tmp_path / "data.bin"
    path.write_bytes(b"".join(array.tobytes() for array in arrays))
    offsets = np.cumsum([0] + [array.nbytes for array in arrays])[:-1]
    order = [5, 0, 2, 7, 1, 6, 3, 4]  # any order
    digests: list[str] = []
    source = open_source(path)
    source.parallel = Parallel(readers=4, piece=4096, threshold=0)
    try:
        got = read_tensors(
            source,
            offsets[order],
            np.array([arrays[i].nbytes for i in order]),
            [np.dtype(np.float32)] * len(order),
            [arrays[i].shape for i in order],
            digests,
        )
    finally:
        source.close()
    for k, i in enumerate(order):
        np.testing.assert_array_equal(got[k], arrays[i])
        assert digests[k] == jaxstow._format.checksum.checksum(arrays[i])
