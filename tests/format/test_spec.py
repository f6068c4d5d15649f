"""``docs/format.md`` says what the code does: its tables of limits, dtypes and versions are the code's constants, its
header checksum (implemented from the text, by the example it gives) and record checksum hold for the golden files, and
the layout it states is what the writer writes. The writer enforces the reader's limits before writing anything."""

from __future__ import annotations

import io
import itertools
import json
import re
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import xxhash

import jaxstow
from jaxstow._format import header as native_header
from jaxstow._format import native
from jaxstow._format.dtypes import (
    _DTYPES,
    MAX_ARRAY_BYTES,
    MAX_AXES,
    PACKED_CODES,
    READ_ONLY_CODES,
    SAFETENSORS_CODES,
    name_of_dtype,
    safetensors_code,
)
from jaxstow._format.header_checksum import header_checksum
from jaxstow._format.json_codec import BYTES_PER_CONTAINER
from jaxstow._format.json_values import MAX_INTEGER_DIGITS, MAX_NESTING
from jaxstow._format.manifest import FORMAT_VERSION
from jaxstow._format.native import DATA_ALIGNMENT, MAX_HEADER_BYTES
from jaxstow._format.npz import stores_exactly as npz_stores_exactly
from jaxstow.errors import CorruptFileError, FormatError, MetadataError
from reliability.forge import forge_native, split_native

ROOT = Path(__file__).parents[2]
SPEC = (ROOT / "docs" / "format.md").read_text()
DATA = ROOT / "tests" / "data"
GOLDEN_NATIVE = sorted(DATA.glob("format_v*.jxs"))


def _table(header_row: str) -> list[list[str]]:
    """The rows of the spec's table that starts with ``header_row``, as cells (the header row and rule left out)."""
    rows = []
    for line in SPEC[SPEC.index(header_row) :].split("\n")[2:]:
        if not line.lstrip().startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_limits_table_is_the_code_s_constants():
    constants = {
        "MAX_HEADER_BYTES": MAX_HEADER_BYTES,
        "BYTES_PER_CONTAINER": BYTES_PER_CONTAINER,
        "MAX_AXES": MAX_AXES,
        "MAX_ARRAY_BYTES": MAX_ARRAY_BYTES,
        "MAX_NESTING": MAX_NESTING,
        "MAX_INTEGER_DIGITS": MAX_INTEGER_DIGITS,
        "DATA_ALIGNMENT": DATA_ALIGNMENT,
    }
    rows = {_names(constant)[0]: value for _, constant, value in _table("| limit | constant | value |")}
    assert rows.keys() == constants.keys()
    for name, value in constants.items():
        assert int(rows[name].split()[0]) == value, name


def test_the_dtype_table_is_the_code_s():
    rows = _table("| name | item size | safetensors code | npz |")
    described: dict[str, tuple[int, str | None, bool]] = {}
    for names, sizes, codes, npz in rows:
        names_list, size_list = _names(names), [int(size) for size in sizes.split(",")]
        code_list: list[str | None] = [None] * len(names_list) if codes == "raw bytes" else list(_names(codes))
        size_list = size_list * len(names_list) if len(size_list) == 1 else size_list
        for name, size, code in zip(names_list, size_list, code_list, strict=True):
            described[name] = (size, code, npz == "exact")
    assert described.keys() == _DTYPES.keys()
    for name, dtype in _DTYPES.items():
        assert described[name] == (dtype.itemsize, safetensors_code(dtype), npz_stores_exactly(dtype)), name
    assert {code for _, code, _ in described.values() if code} == set(SAFETENSORS_CODES)
    read_only = {_names(code)[0]: _names(name)[0] for code, name in _table("| safetensors code | name |")}
    assert read_only == {code: name_of_dtype(dtype) for code, dtype in READ_ONLY_CODES.items()}
    assert all(f"`{code}`" in SPEC for code in PACKED_CODES)
    assert f"`int4` \u22123 is the byte `0x{np.array([-3], ml_dtypes.int4).view(np.uint8)[0]:02X}`" in SPEC


def test_the_versions_table_lists_every_version():
    assert SPEC.startswith(f"# The jaxstow file format\n\nFormat version {FORMAT_VERSION}.")
    versions = [int(row[0]) for row in _table("| version | adds |")]
    assert versions == list(range(1, FORMAT_VERSION + 1))


def _spec_header_checksum() -> Any:
    """The function of the spec's example, run as written."""
    example = re.search(r"```python\n(import struct, xxhash\n.*?)```", SPEC, re.S)
    assert example is not None
    namespace: dict[str, Any] = {}
    exec(example.group(1), namespace)
    return namespace["header_checksum"]


@pytest.mark.parametrize("path", GOLDEN_NATIVE, ids=lambda path: path.name)
def test_the_header_checksum_as_the_spec_states_it(path):
    data = path.read_bytes()
    with jaxstow.open(path):
        pass  # the reader takes the file
    assert _spec_header_checksum()(data) == header_checksum(_source(data))
    damaged = bytearray(data)
    damaged[20] ^= 1
    with pytest.raises(AssertionError, match="the header is corrupt"):
        _spec_header_checksum()(bytes(damaged))


def _source(data: bytes) -> Any:
    from jaxstow._storage.opening import open_source

    return open_source(io.BytesIO(data))


def test_the_layout_the_spec_states_is_what_the_writer_writes():
    data = (DATA / f"format_v{FORMAT_VERSION}.jxs").read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert (8 + length) % DATA_ALIGNMENT == 0 and data[8:9] == b"{"
    header = json.loads(data[8 : 8 + length])
    assert list(header)[-1] == "__metadata__"
    metadata = header.pop("__metadata__")
    assert list(metadata) == ["jaxstow", "note", "jaxstow_header_xxh3"]  # the manifest, the plain keys, the checksum
    spans = sorted((info["data_offsets"], SAFETENSORS_CODES[info["dtype"]].itemsize) for info in header.values())
    assert spans[0][0][0] == 0 and spans[-1][0][1] == len(data) - 8 - length
    for (first, _), (second, _) in itertools.pairwise(spans):
        assert first[1] == second[0]  # tiled
    assert [size for _, size in spans] == sorted((size for _, size in spans), reverse=True)  # largest item first
    assert all(((8 + length + begin) % size) == 0 for (begin, _), size in spans)  # naturally aligned
    assert list(next(iter(header.values()))) == ["dtype", "shape", "data_offsets"]


def test_the_record_checksum_as_the_spec_states_it():
    for path in sorted((DATA / f"checkpoint_v{FORMAT_VERSION}").glob("*/checkpoint.json")):
        data = path.read_bytes()
        found = re.findall(rb'"record_xxh3": "([0-9a-f]{16})"', data)
        assert len(found) == 1
        zeroed = data.replace(b'"record_xxh3": "' + found[0] + b'"', b'"record_xxh3": "' + b"0" * 16 + b'"')
        assert xxhash.xxh3_64_hexdigest(zeroed) == found[0].decode()
        record = json.loads(data)
        assert list(record)[-1] == "record_xxh3" and record["step"] == int(path.parent.name)
        for name, checksum in record["headers"].items():
            assert _spec_header_checksum()((path.parent / name).read_bytes()) == checksum


def _many_leaves(count: int) -> dict[str, np.ndarray]:
    return {f"leaf_{i:05d}": np.zeros(1, np.float32) for i in range(count)}


def test_the_writer_refuses_a_header_over_the_reader_s_limit_before_writing(tmp_path, monkeypatch):
    """With the limit lowered to two pages, a tree whose header needs more is refused, naming the file, and nothing
    is written; the reader refuses the same header (the unpatched writer made) with the same limit."""
    path = tmp_path / "many.jxs"
    jaxstow.save(path, _many_leaves(400))
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    limit = 2 * DATA_ALIGNMENT - 8
    assert length > limit
    monkeypatch.setattr(native, "MAX_HEADER_BYTES", limit)  # the writer's limit
    monkeypatch.setattr(native_header, "MAX_HEADER_BYTES", limit)  # the reader's, the same
    with pytest.raises(jaxstow.errors.CorruptFileError, match=f"header length {length} exceeds the limit of {limit}"):
        jaxstow.load(path)
    with pytest.raises(FormatError, match=rf"{re.escape(str(tmp_path / 'new.jxs'))}: the header would take {length}"):
        jaxstow.save(tmp_path / "new.jxs", _many_leaves(400))
    assert sorted(item.name for item in tmp_path.iterdir()) == ["many.jxs"]
    buffer = io.BytesIO()
    with pytest.raises(FormatError, match="the header would take"):
        jaxstow.save(buffer, _many_leaves(400))
    assert buffer.getvalue() == b""
    jaxstow.save(tmp_path / "few.jxs", _many_leaves(10))  # within the limit
    assert len(jaxstow.load(tmp_path / "few.jxs")) == 10


@pytest.mark.parametrize("suffix", [".jxs", ".npz"])
def test_the_writer_refuses_more_axes_than_a_file_holds(tmp_path, suffix):
    most = np.arange(2.0).reshape((1,) * (MAX_AXES - 1) + (2,))
    jaxstow.save(tmp_path / f"most{suffix}", {"w": most, "b": most.astype(ml_dtypes.bfloat16)})
    np.testing.assert_array_equal(jaxstow.load(tmp_path / f"most{suffix}", as_numpy=True)["b"], most)
    deeper = most[..., None]
    with pytest.raises(
        FormatError, match=f"leaf 'w'.*{MAX_AXES + 1} axes has more than the {MAX_AXES} a jaxstow"
    ) as refused:
        jaxstow.save(tmp_path / f"deeper{suffix}", {"w": deeper})
    assert refused.value.file == str(tmp_path / f"deeper{suffix}")  # an npz's was not named
    assert not (tmp_path / f"deeper{suffix}").exists()


def test_the_reader_refuses_more_axes_than_a_file_holds_whatever_numpy_allows():
    header = {"w": {"dtype": "U8", "shape": [1] * (MAX_AXES + 1), "data_offsets": [0, 1]}}
    with pytest.raises(FormatError, match=f"leaf 'w'.*{MAX_AXES + 1} axes"):
        jaxstow.load(io.BytesIO(forge_native(header, None, b"\0")))


def test_the_writer_refuses_metadata_and_values_over_the_limits(tmp_path):
    deep: Any = []
    for _ in range(MAX_NESTING + 1):
        deep = [deep]
    with pytest.raises(MetadataError, match=f"nests {MAX_NESTING + 1} JSON levels deep"):
        jaxstow.save(tmp_path / "a.jxs", {"w": np.ones(2)}, metadata={"deep": deep[0]})
    with pytest.raises(MetadataError, match=f"more than {MAX_INTEGER_DIGITS} digits"):
        jaxstow.save(tmp_path / "a.jxs", {"w": np.ones(2)}, metadata={"n": 10**MAX_INTEGER_DIGITS})
    with pytest.raises(FormatError, match=f"leaf 'n'.*more than {MAX_INTEGER_DIGITS} digits"):
        jaxstow.save(tmp_path / "a.npz", {"n": -(10**MAX_INTEGER_DIGITS)})
    assert list(tmp_path.iterdir()) == []
    jaxstow.save(tmp_path / "a.jxs", {"n": 10**MAX_INTEGER_DIGITS - 1}, metadata={"n": -(10**MAX_INTEGER_DIGITS - 1)})
    assert jaxstow.load(tmp_path / "a.jxs") == {"n": 10**MAX_INTEGER_DIGITS - 1}


def test_the_reader_refuses_metadata_nested_deeper_than_a_writer_writes():
    tensors, text, data = split_native(_saved({"w": np.ones(2)}))
    assert text is not None
    manifest = json.loads(text)
    deep: Any = 1
    for _ in range(MAX_NESTING + 1):
        deep = [deep]
    manifest["metadata"] = {"deep": deep}
    with pytest.raises(FormatError, match=f"metadata nests {MAX_NESTING + 2} JSON levels deep"):
        jaxstow.load(io.BytesIO(forge_native(tensors, json.dumps(manifest), data)))


def _saved(tree: Any) -> bytes:
    buffer = io.BytesIO()
    jaxstow.save(buffer, tree)
    return buffer.getvalue()


def test_a_header_in_another_encoding_than_utf8_is_refused():
    text = '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'.encode("utf-16-le")
    padded = text.ljust(DATA_ALIGNMENT - 8, b" ")
    with pytest.raises(FormatError, match="the header is not valid JSON"):
        jaxstow.load(io.BytesIO(struct.pack("<Q", len(padded)) + padded + bytes(8)))


def test_bytes_after_the_last_tensor_are_damage():
    data = _saved({"w": np.arange(3, dtype=np.float32)})
    for joined in (data + b"\0", data + data):  # a file written over in place, or two files joined
        with pytest.raises(CorruptFileError, match="the data region must hold the tensors and nothing else"):
            jaxstow.load(io.BytesIO(joined))  # a FormatError, not damage: jaxstow verify ended with status 2, not 1


def test_the_checksum_key_must_close_the_header():
    """A header whose checksummed text ends with the checksum, but not as the last member of ``__metadata__`` in the
    header's last member, is refused even though the hash matches."""
    tensors, text, data = split_native(_saved({"w": np.ones(2, np.float32)}))
    assert text is not None
    forged = forge_native(tensors, text, data)
    (length,) = struct.unpack("<Q", forged[:8])
    header = json.loads(forged[8 : 8 + length])
    metadata = header.pop("__metadata__")
    entry = header.pop("w")
    moved = json.dumps(
        {"__metadata__": {**metadata, "jaxstow_header_xxh3": "0" * 16}, "w": entry}, separators=(",", ":")
    )
    moved = moved[:-2] + ',"jaxstow_header_xxh3":"0000000000000000"}}'
    raw = moved.encode()
    raw = raw[:-19] + xxhash.xxh3_64_hexdigest(raw).encode() + b'"}}'
    padded = raw.ljust(length, b" ")
    with pytest.raises(jaxstow.errors.CorruptFileError, match="are not jaxstow's"):
        jaxstow.load(io.BytesIO(struct.pack("<Q", len(padded)) + padded + data))


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999", "-2.5E400"])
def test_json_that_rfc_8259_has_not_is_refused_in_a_header_and_in_a_manifest(constant):
    """Nor a number that overflows a float, which a parser would read as infinite: no writer of ours writes one."""
    plain = ('{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":' + constant + "}}").encode()
    with pytest.raises(FormatError, match="is not valid JSON"):
        jaxstow.load(io.BytesIO(len(plain).to_bytes(8, "little") + plain + bytes(4)))
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"w": np.ones(1, np.float32)}, metadata={"k": 1})
    tensors, manifest, data = split_native(buffer.getvalue())
    assert manifest is not None and '"k":1' in manifest
    forged = forge_native(tensors, manifest.replace('"k":1', f'"k":{constant}'), data)
    with pytest.raises(FormatError, match="the jaxstow manifest is not valid JSON"):
        jaxstow.load(io.BytesIO(forged))


@pytest.mark.parametrize("metadata", ["[]", "0", "false", '""'])
def test_a_metadata_member_that_is_no_object_nor_null_is_refused_however_empty(metadata):
    plain = ('{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":' + metadata + "}").encode()
    with pytest.raises(FormatError, match="__metadata__ must map strings to strings"):
        jaxstow.load(io.BytesIO(len(plain).to_bytes(8, "little") + plain + bytes(4)))
