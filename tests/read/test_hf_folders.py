"""Folders of safetensors files (Hugging Face's sharded checkpoints) loaded and opened as one lazy file."""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from counting import CountingSource
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

import jaxstow
from jaxstow import huggingface
from jaxstow._format.dtypes import READ_ONLY_CODES, SAFETENSORS_CODES
from jaxstow.errors import (
    ArgumentError,
    FormatError,
    IsAFolderError,
    PathError,
    PathNotFoundError,
    StructureMismatchError,
    TruncatedFileError,
)

RNG = np.random.default_rng(7)
TENSORS = {
    "model.embed.weight": RNG.standard_normal((16, 8)).astype(np.float32),
    "model.layers.0.proj.weight": RNG.standard_normal((12, 8)).astype(ml_dtypes.bfloat16),
    "model.layers.0.proj.bias": RNG.standard_normal(12).astype(np.float32),
    "model.layers.1.proj.weight": RNG.standard_normal((12, 8)).astype(ml_dtypes.bfloat16),
    "model.layers.1.proj.bias": RNG.standard_normal(12).astype(np.float32),
    "lm_head.weight": RNG.standard_normal((8, 16)).astype(np.float32),
}
SHARDS = [["model.embed.weight", "lm_head.weight"], ["model.layers.0.proj.weight", "model.layers.0.proj.bias"]]
SHARDS.append(["model.layers.1.proj.weight", "model.layers.1.proj.bias"])


def _write(folder: Path, tensors=TENSORS, shards=SHARDS, *, index: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for number, names in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: tensors[name] for name in names}, str(folder / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file)
    if index:
        total = sum(array.nbytes for array in tensors.values())
        index_text = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
        (folder / "model.safetensors.index.json").write_text(index_text)
    return folder


@pytest.fixture
def folder(tmp_path) -> Path:
    return _write(tmp_path / "hf")


def _like(transposed: bool = True) -> dict:
    def proj() -> dict:
        shape = (8, 12) if transposed else (12, 8)
        return {"weight": jnp.zeros(shape, jnp.bfloat16), "bias": jnp.zeros(12, jnp.float32)}

    return {
        "model": {"embed": {"weight": jnp.zeros((16, 8))}, "layers": [{"proj": proj()}, {"proj": proj()}]},
        "lm_head": {"weight": jnp.zeros((8, 16))},
    }


def _equal(got, want) -> None:
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


@pytest.mark.parametrize("index", [True, False], ids=["index", "shards-only"])
def test_without_like_a_flat_dict_by_tensor_name(tmp_path, index):
    folder = _write(tmp_path / "hf", index=index)
    restored = jaxstow.load(folder)
    assert sorted(restored) == sorted(TENSORS)
    for name, array in TENSORS.items():
        assert isinstance(restored[name], jax.Array) and restored[name].dtype == array.dtype
        _equal(restored[name], array)


def test_open_is_lazy_and_reads_slices_by_byte_ranges(folder):
    with jaxstow.open(folder) as reader:
        assert isinstance(reader, jaxstow.Reader)
        assert reader.paths == sorted(TENSORS)
        assert reader.metadata == {"total_size": sum(array.nbytes for array in TENSORS.values())}
        assert reader.info("lm_head.weight") == jaxstow.LeafInfo("lm_head.weight", "array", np.float32, (8, 16), 512)
        counting = [CountingSource(container.source) for container in reader.containers]
        for container, source in zip(reader.containers, counting, strict=True):
            container.source = source
        _equal(reader.read("lm_head.weight", np.s_[2:4]), TENSORS["lm_head.weight"][2:4])
        assert [source.bytes_read for source in counting] == [2 * 16 * 4, 0, 0]
        _equal(reader["model.layers.1.proj.bias"], TENSORS["model.layers.1.proj.bias"])
        assert reader.abstract["model.embed.weight"] == jax.ShapeDtypeStruct((16, 8), jnp.float32)


def test_like_takes_dotted_names_as_paths_and_transposed_weights(folder):
    restored = huggingface.load(folder, _like(), transposed=lambda name: name.endswith("proj.weight"))
    for layer in (0, 1):
        _equal(restored["model"]["layers"][layer]["proj"]["weight"], TENSORS[f"model.layers.{layer}.proj.weight"].T)
        _equal(restored["model"]["layers"][layer]["proj"]["bias"], TENSORS[f"model.layers.{layer}.proj.bias"])
    _equal(restored["lm_head"]["weight"], TENSORS["lm_head.weight"])
    untransposed = jaxstow.load(folder, _like(transposed=False))
    _equal(untransposed["model"]["layers"][1]["proj"]["weight"], TENSORS["model.layers.1.proj.weight"])


def test_names_map_onto_another_tree_and_leave_tensors_out(folder):
    def names(tensor: str) -> str | None:
        return "head/kernel" if tensor == "lm_head.weight" else "embedding" if tensor == "model.embed.weight" else None

    like = {"head": {"kernel": jnp.zeros((16, 8))}, "embedding": jnp.zeros((16, 8))}
    restored = huggingface.load(folder, like, names=names, transposed={"lm_head.weight"})
    _equal(restored["head"]["kernel"], TENSORS["lm_head.weight"].T)
    _equal(restored["embedding"], TENSORS["model.embed.weight"])
    mapped = huggingface.load(folder, like, names={"lm_head.weight": "head/kernel", "model.embed.weight": "embedding"},
                              transposed={"lm_head.weight"})  # fmt: skip
    _equal(mapped["head"]["kernel"], TENSORS["lm_head.weight"].T)
    without_like = huggingface.load(folder, names=names, as_numpy=True)
    assert sorted(without_like) == ["embedding", "head/kernel"]
    with huggingface.open(folder, names=names) as reader:
        assert sorted(reader.load(as_numpy=True)) == ["embedding", "head/kernel"]
        assert sorted(reader.load(names=str, as_numpy=True)) == sorted(TENSORS)
        turned = reader.load(like, transposed={"lm_head.weight"})
    _equal(turned["head"]["kernel"], TENSORS["lm_head.weight"].T)


def test_a_names_dict_leaves_out_a_tensor_mapped_to_none_and_refuses_a_path_that_is_no_string(folder):
    names = {"lm_head.weight": "head", "model.embed.weight": None}
    assert sorted(huggingface.load(folder, names=names, as_numpy=True)) == ["head"]
    with pytest.raises(ArgumentError, match=r"names= gives 'lm_head\.weight' the path 3: a string, or None"):
        huggingface.load(folder, names={"lm_head.weight": 3}, as_numpy=True)


def test_partial_cast_and_select(folder):
    like = {"lm_head": {"weight": jax.ShapeDtypeStruct((8, 16), jnp.float64)}}
    with pytest.raises(StructureMismatchError, match="pass cast=True"):
        jaxstow.load(folder, like, partial=True)
    restored = jaxstow.load(folder, like, partial=True, cast=True, as_numpy=True)
    np.testing.assert_array_equal(restored["lm_head"]["weight"], TENSORS["lm_head.weight"].astype(np.float64))
    assert sorted(jaxstow.load(folder, select="model.layers.1.*", as_numpy=True)) == [
        "model.layers.1.proj.bias",
        "model.layers.1.proj.weight",
    ]
    with pytest.raises(StructureMismatchError, match="in the file but not in the structure"):
        jaxstow.load(folder, like={"lm_head": {"weight": jnp.zeros((8, 16))}})


def test_each_device_reads_only_its_rows(folder):
    mesh = jax.make_mesh((4,), ("x",))
    like = {"model": {"embed": {"weight": jax.ShapeDtypeStruct((16, 8), jnp.float32)}}}
    with jaxstow.open(folder) as reader:
        counting = [CountingSource(container.source) for container in reader.containers]
        for container, source in zip(reader.containers, counting, strict=True):
            container.source = source
        restored = reader.load(like, partial=True, sharding=NamedSharding(mesh, P("x")))
    assert [source.bytes_read for source in counting] == [16 * 8 * 4, 0, 0]  # its rows, each once; nothing else
    weight = restored["model"]["embed"]["weight"]
    assert len(weight.addressable_shards) == 4
    for shard in weight.addressable_shards:
        assert shard.data.shape == (4, 8)
        _equal(shard.data, TENSORS["model.embed.weight"][shard.index])


def test_transposed_tensors_land_sharded(folder):
    mesh = jax.make_mesh((2, 2), ("a", "b"))
    restored = huggingface.load(
        folder,
        _like(),
        transposed=lambda name: "proj.weight" in name,
        sharding=lambda path, shape, dtype: NamedSharding(mesh, P("a", "b") if len(shape) == 2 else P()),
    )
    weight = restored["model"]["layers"][0]["proj"]["weight"]
    assert weight.sharding.spec == P("a", "b") and weight.shape == (8, 12)
    for shard in weight.addressable_shards:
        _equal(shard.data, TENSORS["model.layers.0.proj.weight"].T[shard.index])


@pytest.mark.parametrize("code", sorted(SAFETENSORS_CODES))
def test_every_safetensors_dtype(tmp_path, code):
    dtype = SAFETENSORS_CODES[code]
    raw = RNG.integers(0, 256, 24 * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw = raw % 2
    array = raw.view(dtype).reshape(4, -1)
    folder = tmp_path / "hf"
    folder.mkdir()
    from jaxstow._format.native import write_native

    with open(folder / "model-00001-of-00001.safetensors", "wb") as sink:
        write_native(sink, [("t", array)], None, plain={"format": "pt"})
    restored = jaxstow.load(folder, as_numpy=True)["t"]
    assert restored.dtype == dtype
    _equal(restored, array)


def _plain_file(path, code: str, shape: list[int], data: bytes) -> None:
    """A safetensors file written by hand, as a newer safetensors writes a code jaxstow itself never writes."""
    header = json.dumps({"t": {"dtype": code, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize("code", sorted(READ_ONLY_CODES))
def test_the_newer_safetensors_codes_are_read(tmp_path, code):
    dtype = READ_ONLY_CODES[code]
    raw = RNG.integers(0, 256, 12, dtype=np.uint8)
    folder = tmp_path / "hf"
    folder.mkdir()
    _plain_file(folder / "model-00001-of-00001.safetensors", code, [3, 4], raw.tobytes())
    restored = jaxstow.load(folder, as_numpy=True)["t"]
    assert restored.dtype == dtype
    np.testing.assert_array_equal(restored.view(np.uint8), raw.reshape(3, 4))


def test_a_packed_code_is_refused_by_name(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    _plain_file(folder / "model-00001-of-00001.safetensors", "F4", [4], bytes(2))
    with pytest.raises(FormatError, match="F4 packs several elements to a byte"):
        jaxstow.load(folder, as_numpy=True)


def test_a_missing_shard_is_named(folder):
    os.remove(folder / "model-00002-of-00003.safetensors")
    with pytest.raises(
        PathNotFoundError, match=r"model-00002-of-00003.safetensors: is missing.*model.layers.0"
    ) as info:
        jaxstow.load(folder)
    assert info.value.file.endswith("model-00002-of-00003.safetensors")


def test_a_damaged_shard_is_named(folder):
    path = folder / "model-00003-of-00003.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:8] + b"{not json" + data[17:])
    with pytest.raises(FormatError) as info:
        jaxstow.open(folder)
    assert "model-00003-of-00003.safetensors" in str(info.value)
    path.write_bytes(data[:-10])
    with pytest.raises(TruncatedFileError, match=r"model-00003-of-00003\.safetensors") as info:
        jaxstow.load(folder)
    assert info.value.path == "model.layers.1.proj.weight"


def test_an_index_naming_a_tensor_its_shard_lacks(folder):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        FormatError, match=r"model\.norm\.weight.*maps it to model-00001-of-00003\.safetensors, which"
    ) as info:
        jaxstow.open(folder)
    assert info.value.file.endswith("model.safetensors.index.json")  # the index says what is not there


def test_an_index_pointing_outside_the_folder_is_refused(folder):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "../elsewhere.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match=r"not a \.safetensors file of the folder"):
        jaxstow.open(folder)


def test_arguments_that_do_not_fit(folder, tmp_path):
    with pytest.raises(ArgumentError) as info:  # the predicate of every weight meets a norm's, or a bias
        huggingface.load(folder, _like(), transposed=lambda name: name.startswith("model.layers.0"))
    assert str(info.value) == (
        f"{folder}: transposed= marks 'model.layers.0.proj.bias', of shape [12]: only 2-d tensors turn (a conv weight "
        "in torch's layout turns with numpy.moveaxis(weight, (0, 1), (-1, -2)) once read): leave it out of transposed=, whose predicate may test the layer's name, as "
        "lambda name: name.endswith('proj.weight') does"
    )
    with pytest.raises(ArgumentError, match=r"marks 'model\.layers\.1\.proj\.bias' \(path 'bias'\), of shape \[12\]"):
        huggingface.load(folder, names={"model.layers.1.proj.bias": "bias"}, transposed=lambda name: "bias" in name)
    with pytest.raises(ArgumentError, match="lacks"):
        huggingface.load(folder, _like(), transposed={"no.such"})
    for wrong in (True, 1, {"model.layers.0.proj.weight": True}, "model.layers.0.proj.weight", [1]):
        with pytest.raises(ArgumentError, match="transposed= "):
            huggingface.load(folder, _like(), transposed=wrong)
    with pytest.raises(ArgumentError, match=r"names= takes a mapping .*dict\(pairs\)"):
        huggingface.load(folder, names=[("lm_head.weight", "head")])
    with pytest.raises(ArgumentError, match="the path 'same'"):
        huggingface.load(folder, {"same": jnp.zeros(1)}, names=lambda name: "same")
    jaxstow.save(tmp_path / "file.jxs", {"w": jnp.ones(2)})
    with pytest.raises(ArgumentError, match=r"file\.jxs: is a file, not a folder of safetensors files"):
        huggingface.load(tmp_path / "file.jxs", names=lambda name: name)
    with pytest.raises(ArgumentError, match="folder of safetensors files"):
        jaxstow.open(folder, mmap=True)


def test_a_folder_on_s3(s3_server, tmp_path):
    import fsspec

    local = _write(tmp_path / "hf")
    url = s3_server.url("hf-folder")
    fs, root = fsspec.core.url_to_fs(url, **s3_server.storage_options)
    for path in local.iterdir():
        fs.put_file(str(path), f"{root}/{path.name}")
    restored = huggingface.load(url, _like(), transposed=lambda name: "proj.weight" in name,
                                storage_options=s3_server.storage_options)  # fmt: skip
    _equal(restored["model"]["layers"][1]["proj"]["weight"], TENSORS["model.layers.1.proj.weight"].T)
    with jaxstow.open(url + "/", storage_options=s3_server.storage_options) as reader:
        _equal(reader.read("model.embed.weight", np.s_[3]), TENSORS["model.embed.weight"][3])
    fs.rm(f"{root}/model-00002-of-00003.safetensors")
    with pytest.raises(PathNotFoundError, match=r"model-00002-of-00003\.safetensors: is missing"):
        jaxstow.load(url, storage_options=s3_server.storage_options)


def test_a_jaxstow_file_of_any_name_beside_a_stray_safetensors_file_on_s3_is_refused(s3_server, tmp_path):
    import fsspec

    folder = tmp_path / "run"
    folder.mkdir()
    jaxstow.save(folder / "model.jaxstow", {"w": jnp.ones(3)})
    save_file({"stray": np.zeros(2, np.float32)}, str(folder / "notes-export.safetensors"))
    (folder / "tokenizer.model").write_bytes(b"\x00" * 64)  # another program's file: not a model file
    url = s3_server.url("stray-beside-model")
    fs, root = fsspec.core.url_to_fs(url, **s3_server.storage_options)
    for path in folder.iterdir():
        fs.put_file(str(path), f"{root}/{path.name}")
    for call in (jaxstow.load, huggingface.load):
        with pytest.raises(
            IsAFolderError, match=r"holds model\.jaxstow \(a jaxstow or safetensors file\) beside notes"
        ):
            call(url, storage_options=s3_server.storage_options)
    fs.rm(f"{root}/model.jaxstow")
    assert jaxstow.load(url, storage_options=s3_server.storage_options, as_numpy=True)["stray"].tolist() == [0, 0]


def test_a_folder_on_s3_that_another_client_changes_is_listed_anew_at_each_load(s3_server, tmp_path):
    import fsspec
    from safetensors.numpy import save

    url = s3_server.url("changing-folder")
    other_client = fsspec.filesystem("s3", skip_instance_cache=True, **s3_server.storage_options)
    root = url.removeprefix("s3://")
    load = lambda: jaxstow.load(url, storage_options=s3_server.storage_options, as_numpy=True)  # noqa: E731
    other_client.pipe_file(f"{root}/a.safetensors", save({"a": np.ones(2, np.float32)}))
    assert sorted(load()) == ["a"]
    other_client.pipe_file(f"{root}/b.safetensors", save({"b": np.zeros(3, np.float32)}))
    assert sorted(load()) == ["a", "b"]
    jaxstow.save(tmp_path / "model.jxs", {"w": np.ones(2)})
    other_client.put_file(str(tmp_path / "model.jxs"), f"{root}/model.jxs")
    with pytest.raises(IsAFolderError, match=r"holds model\.jxs \(a jaxstow file\) beside a\.safetensors"):
        load()


def test_an_export_to_s3_cut_short_is_refused_by_loads_and_named_by_the_next_export(s3_server, tmp_path):
    import fsspec

    jaxstow.save(tmp_path / "model.jxs", {f"layer{i}": np.full(256, i, np.float32) for i in range(3)})
    url, options = s3_server.url("cut-export"), s3_server.storage_options
    transfer = jaxstow.Transfer(part_size=5 * 2**20)  # as save, load and open take it
    jaxstow.export_safetensors(
        tmp_path / "model.jxs", url, max_shard_size=1024, storage_options=options, transfer=transfer
    )
    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.rm([f"{root}/model.safetensors.index.json", f"{root}/model-00003-of-00003.safetensors"])  # as a kill leaves it
    with pytest.raises(PathNotFoundError, match=r"model-00003-of-00003\.safetensors: is missing"):
        jaxstow.load(url, storage_options=options)
    with pytest.raises(PathError, match=r"exists already: .*no index, as an export cut short leaves it: remove them"):
        jaxstow.export_safetensors(tmp_path / "model.jxs", url, max_shard_size=1024, storage_options=options)


def test_an_s3_url_ending_in_a_slash_names_the_folder_beside_an_object_of_the_same_name(s3_server, tmp_path):
    import fsspec
    from safetensors.numpy import save

    url, options = s3_server.url("model"), s3_server.storage_options
    fs, root = fsspec.core.url_to_fs(url, **options)
    jaxstow.save(tmp_path / "file.jxs", {"w": np.full(2, 1.0, np.float32)})
    fs.put_file(str(tmp_path / "file.jxs"), root)  # the object "model", and the folder "model/" beside it
    fs.pipe_file(f"{root}/model.safetensors", save({"w": np.full(2, 2.0, np.float32)}))
    assert jaxstow.load(url, storage_options=options, as_numpy=True)["w"].tolist() == [1.0, 1.0]
    for call in (jaxstow.load, huggingface.load):
        assert call(url + "/", storage_options=options, as_numpy=True)["w"].tolist() == [2.0, 2.0]
    with pytest.raises(PathError, match=r"model: is a file \(an object of the store\), not a folder"):
        jaxstow.export_safetensors(tmp_path / "file.jxs", url, storage_options=options)
    assert jaxstow.load(url, storage_options=options, as_numpy=True)["w"].tolist() == [1.0, 1.0]  # left as it was


def test_a_tree_without_arrays_is_not_exported_to_a_folder_nothing_loads(tmp_path):
    jaxstow.save(tmp_path / "plain.jxs", {"epoch": 3, "name": "run"})
    with pytest.raises(ArgumentError, match=r"plain\.jxs: there is no array to export: it holds 'epoch', 'name'"):
        jaxstow.export_safetensors(tmp_path / "plain.jxs", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_numbered_shards_without_an_index_are_refused_unless_all_are_there(tmp_path):
    folder = tmp_path / "cut"
    folder.mkdir()
    for number in (1, 2):  # of 3: an interrupted download, copy or export
        save_file({f"layer{number}": np.ones(2, np.float32)}, str(folder / f"model-0000{number}-of-00003.safetensors"))
    for call in (jaxstow.load, huggingface.load, jaxstow.open):
        with pytest.raises(PathNotFoundError, match=r"model-00003-of-00003\.safetensors: is missing: .*not all 3 of"):
            call(folder)
    save_file({"layer3": np.ones(2, np.float32)}, str(folder / "model-00003-of-00003.safetensors"))
    assert sorted(jaxstow.load(folder)) == ["layer1", "layer2", "layer3"]


def test_an_index_that_passes_over_a_numbered_shard_the_folder_holds_is_refused(folder):
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {
        name: shard for name, shard in index["weight_map"].items() if shard != "model-00003-of-00003.safetensors"
    }  # an index edited by hand, or cut short: layer 1 would be left out of every load
    index_path.write_text(json.dumps(index))
    for call in (jaxstow.load, huggingface.load, jaxstow.open):
        with pytest.raises(FormatError) as info:
            call(folder)
        assert info.value.file == str(folder / "model.safetensors.index.json")
        assert str(info.value).endswith(
            "names model-00001-of-00003.safetensors, but not model-00003-of-00003.safetensors, which the folder "
            "holds: every load would leave its tensors out. Fetch the model's model.safetensors.index.json again, or "
            "move model-00003-of-00003.safetensors away if it is no part of the model"
        )
    (folder / "model-00003-of-00003.safetensors").rename(folder / "consolidated.safetensors")  # of no series
    assert "model.layers.1.proj.bias" not in jaxstow.load(folder)


def test_each_process_reads_only_the_rows_its_devices_hold(tmp_path):
    rows = np.arange(1024 * 256, dtype=np.float32).reshape(1024, 256)
    folder = _write(tmp_path / "hf", {"w": rows, "b": rows[0].copy()}, [["w"], ["b"]])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    worker = Path(__file__).parents[1] / "distributed" / "hf_folder_worker.py"
    processes = [
        subprocess.Popen(
            [sys.executable, str(worker), str(index), "2", "2", str(port), str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for index in range(2)
    ]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, f"{out}\n{err[-3000:]}"
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for report in reports:
        assert report["bytes_held"] == rows.nbytes // 2
        assert rows.nbytes // 2 <= report["bytes_read"] < rows.nbytes // 2 + (64 << 10)  # its half of w, b, headers


def _square_folder(tmp_path, n: int) -> tuple[Path, np.ndarray]:
    """A folder with a square ``fc.weight`` (torch's (out, in)) and its bias, as a Hugging Face export holds them."""
    weight = np.arange(n * n, dtype=np.float32).reshape(n, n)
    folder = _write(tmp_path / "square", {"fc.weight": weight, "fc.bias": np.ones(n, np.float32)}, [["fc.weight"], ["fc.bias"]])  # fmt: skip
    return folder, weight


@pytest.mark.parametrize("n", [3, 16])
@pytest.mark.parametrize("marks", ["set", "predicate"])
def test_a_square_tensor_marked_transposed_is_turned_over(tmp_path, n, marks):
    folder, weight = _square_folder(tmp_path, n)
    transposed = {"fc.weight"} if marks == "set" else (lambda name: name.endswith(".weight"))
    like = {"fc": {"kernel": jnp.zeros((n, n))}}
    names = {"fc.weight": "fc/kernel"}
    loaded = huggingface.load(folder, like=like, names=names, transposed=transposed)
    _equal(loaded["fc"]["kernel"], weight.T)
    with huggingface.open(folder, names=names, transposed=transposed) as reader:
        _equal(reader.load(like)["fc"]["kernel"], weight.T)
        _equal(reader["fc/kernel"], weight.T)
        _equal(reader.read("fc/kernel", np.s_[1]), weight.T[1])
        _equal(reader.read("fc/kernel", np.s_[1:, :2]), weight.T[1:, :2])
        assert reader.info("fc/kernel").shape == (n, n)
    with jaxstow.open(folder) as reader:  # a plain reader: the names and marks given to its load
        _equal(reader.load(like, names=names, transposed=transposed)["fc"]["kernel"], weight.T)
        _equal(reader["fc.weight"], weight)  # and as stored when nothing marks it
    with huggingface.open(folder, transposed=transposed) as reader:  # by tensor name, turned over
        _equal(reader["fc.weight"], weight.T)
        _equal(reader.read("fc.weight", np.s_[:, 0]), weight.T[:, 0])
        _equal(reader.load(as_numpy=True)["fc.weight"], weight.T)


def test_names_to_turn_given_by_an_iterator_are_all_turned(tmp_path):
    # An iterator was read out by the check of unknown names, so nothing was turned: a square weight came back as
    # stored, silently.
    folder, weight = _square_folder(tmp_path, 3)
    like, names = {"fc": {"kernel": jnp.zeros((3, 3))}}, {"fc.weight": "fc/kernel"}
    loaded = huggingface.load(folder, like=like, names=names, transposed=(name for name in ["fc.weight"]))
    _equal(loaded["fc"]["kernel"], weight.T)
    with huggingface.open(folder, transposed=iter(["fc.weight"])) as reader:
        _equal(reader["fc.weight"], weight.T)
        _equal(reader.load(as_numpy=True)["fc.weight"], weight.T)  # the names kept, not the iterator read again


def test_a_square_tensor_turns_over_onto_a_mesh(tmp_path):
    folder, weight = _square_folder(tmp_path, 16)
    mesh = jax.make_mesh((2, 2), ("a", "b"))
    like = {"fc": {"kernel": jax.ShapeDtypeStruct((16, 16), jnp.float32, sharding=NamedSharding(mesh, P("a", "b")))}}
    loaded = huggingface.load(folder, like, names={"fc.weight": "fc/kernel"}, transposed={"fc.weight"})
    kernel = loaded["fc"]["kernel"]
    assert kernel.sharding.spec == P("a", "b")
    for shard in kernel.addressable_shards:  # each device's box, read by byte ranges from the turned tensor
        _equal(shard.data, weight.T[shard.index])


def test_a_square_weight_left_turned_beside_gpt2_conv1d_weights_stored_in_out_is_refused(tmp_path):
    # GPT-2's Conv1D stores its weight (in, out), flax's layout: a habit of marking every weight is refused by shape for
    # the oblong ones only, and the square c_proj left marked would have loaded turned over.
    tensors = {
        "h.0.attn.c_attn.weight": RNG.standard_normal((8, 24)).astype(np.float32),
        "h.0.attn.c_proj.weight": RNG.standard_normal((8, 8)).astype(np.float32),
        "h.0.mlp.c_fc.weight": RNG.standard_normal((8, 32)).astype(np.float32),
        "wte.weight": RNG.standard_normal((50, 8)).astype(np.float32),
    }
    folder = _write(tmp_path / "gpt2", tensors, [list(tensors)])
    like = {
        "h": [{"attn": {"c_attn": {"kernel": jnp.zeros((8, 24))}, "c_proj": {"kernel": jnp.zeros((8, 8))}},
               "mlp": {"c_fc": {"kernel": jnp.zeros((8, 32))}}}],
        "wte": {"embedding": jnp.zeros((50, 8))},
    }  # fmt: skip
    names = lambda name: name.replace(".", "/").replace("wte/weight", "wte/embedding").replace("weight", "kernel")  # noqa: E731
    with pytest.raises(StructureMismatchError) as info:
        huggingface.load(folder, like, names=names, transposed={name for name in tensors if name.startswith("h.")})
    assert str(info.value).endswith(
        "leave 'h.0.mlp.c_fc.weight' out of transposed=, and with it the square tensors of its kind, whose shapes "
        "cannot tell: ['h.0.attn.c_proj.weight']"
    )

    with pytest.raises(ArgumentError) as refused:  # the oblong ones taken out as their own advice said, alone
        huggingface.load(folder, like, names=names, transposed={"h.0.attn.c_proj.weight"})
    assert str(refused.value) == (
        f"{folder}: transposed= turns the square 'h.0.attn.c_proj.weight' over but not 'h.0.attn.c_attn.weight', "
        "'h.0.mlp.c_fc.weight' of the same kind ('weight' tensors filling 'kernel' leaves): a folder stores a kind one "
        "way round, and a square tensor's shape fits either way and cannot tell which: mark every 2-d one of them if "
        "they are stored (out, in), as torch's Linear.weight is, or pass transposed=() if they are stored (in, out), as "
        "GPT-2's Conv1D.weight is (leaf 'h/0/attn/c_proj/kernel': [8, 8])"
    )
    params = huggingface.load(folder, like, names=names, transposed=(), as_numpy=True)  # every kernel as stored
    np.testing.assert_array_equal(params["h"][0]["attn"]["c_proj"]["kernel"], tensors["h.0.attn.c_proj.weight"])


def test_a_turned_tensor_that_does_not_fit_names_both_shapes(tmp_path):
    folder = _write(tmp_path / "hf", {"fc.weight": np.zeros((4, 3), np.float32)}, [["fc.weight"]])
    with pytest.raises(StructureMismatchError) as info:
        huggingface.load(folder, {"fc": {"kernel": jnp.zeros((4, 3))}}, names={"fc.weight": "fc/kernel"},
                         transposed={"fc.weight"})  # fmt: skip
    message = str(info.value)
    assert "'fc/kernel': the file has float32[3, 4] (tensor 'fc.weight' stored as [4, 3], turned over by " in message
    assert "expected float32[4, 3]" in message


def test_a_tensor_whose_shape_turned_over_fits_its_leaf_names_the_transposed_that_fits_it(tmp_path):
    folder = _write(tmp_path / "hf", {"fc.weight": np.zeros((4, 3), np.float32)}, [["fc.weight"]])
    names = {"fc.weight": "fc/kernel"}
    with pytest.raises(StructureMismatchError) as info:
        huggingface.load(folder, {"fc": {"kernel": jnp.zeros((3, 4))}}, names=names)
    assert str(info.value).endswith(
        "expected float32[3, 4]: the shape turned over; pass transposed={'fc.weight'} if it is stored (out, in), as "
        "torch's Linear.weight is"
    )
    with pytest.raises(StructureMismatchError) as info:
        huggingface.load(folder, {"fc": {"kernel": jnp.zeros((4, 3))}}, names=names, transposed={"fc.weight"})
    assert str(info.value).endswith("like asks for it as stored; leave 'fc.weight' out of transposed=")
    with pytest.raises(StructureMismatchError) as info:  # another shape altogether: no advice
        huggingface.load(folder, {"fc": {"kernel": jnp.zeros((2, 6))}}, names=names)
    assert str(info.value).endswith("expected float32[2, 6]")


def test_a_stray_safetensors_file_beside_a_jaxstow_file_is_refused(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    jaxstow.save(folder / "model.jxs", {"w": jnp.ones(3)})
    save_file({"notes": np.zeros(2, np.float32)}, str(folder / "notes-export.safetensors"))
    for call in (jaxstow.load, jaxstow.open):
        with pytest.raises(IsAFolderError) as info:
            call(folder)
        message = str(info.value)
        assert "holds model.jxs (a jaxstow file) beside notes-export.safetensors" in message
        assert f"jaxstow.load({str(folder / 'model.jxs')!r})" in message
    assert jaxstow.load(folder / "model.jxs", as_numpy=True)["w"].tolist() == [1.0, 1.0, 1.0]


def test_a_plain_safetensors_file_named_in_capitals_is_not_called_a_jaxstow_file(tmp_path):
    save_file({"w": np.ones(3, np.float32)}, str(tmp_path / "model.safetensors"))
    save_file({"w": np.zeros(3, np.float32)}, str(tmp_path / "model.SAFETENSORS"))
    with pytest.raises(IsAFolderError, match=r"holds model\.SAFETENSORS \(a jaxstow or safetensors file\) beside"):
        jaxstow.load(tmp_path)  # was "(a jaxstow file)"


@pytest.mark.parametrize("name", ["model.jaxstow", "model", "params.ckpt", "MODEL.JXS", "weights.NPZ"])
def test_a_jaxstow_or_npz_file_of_any_name_beside_a_stray_safetensors_file_is_refused(tmp_path, name):
    folder = tmp_path / "run"
    folder.mkdir()
    if name.endswith("NPZ"):
        with open(folder / name, "wb") as file:
            np.savez(file, w=np.ones(3))
    else:
        jaxstow.save(folder / name, {"w": jnp.ones(3)})
    save_file({"notes": np.zeros(2, np.float32)}, str(folder / "notes-export.safetensors"))
    (folder / "config.json").write_text("{}")
    (folder / "README").write_text("a model")
    for call in (jaxstow.load, jaxstow.open, huggingface.load):
        with pytest.raises(IsAFolderError, match=f"holds {re.escape(name)} \\(an? .+\\) beside notes-export"):
            call(folder)


def test_a_folder_holding_an_npz_or_a_jaxstow_safetensors_file_is_refused(tmp_path):
    with_npz = _write(tmp_path / "npz", index=False)
    np.savez(with_npz / "extra.npz", a=np.arange(3))
    with pytest.raises(IsAFolderError, match=r"holds extra\.npz \(an npz file\) beside model-00001-of-00003"):
        jaxstow.load(with_npz)
    named = _write(tmp_path / "named", index=False)
    jaxstow.save(named / "params.safetensors", {"layer": {"w": jnp.ones(2)}})  # jaxstow's own, named .safetensors
    with pytest.raises(IsAFolderError, match=r"holds params\.safetensors \(a jaxstow file\)") as info:
        jaxstow.open(named)
    assert f"jaxstow.load({str(named / 'params.safetensors')!r})" in str(info.value)
    alone = tmp_path / "alone"
    alone.mkdir()
    jaxstow.save(alone / "model.jxs", {"w": jnp.ones(2)})
    with pytest.raises(IsAFolderError, match=r"holds model\.jxs \(a jaxstow file\), and no model\.safetensors"):
        jaxstow.load(alone)


def test_an_index_decides_and_other_libraries_weights_are_left_alone(tmp_path):
    folder = _write(tmp_path / "hf")
    jaxstow.save(folder / "model.jxs", {"w": jnp.ones(2)})  # beside an index: the index names the model's files
    assert sorted(jaxstow.load(folder, as_numpy=True)) == sorted(TENSORS)
    single = _write(tmp_path / "single", {"w": TENSORS["lm_head.weight"]}, [["w"]], index=False)
    (single / "pytorch_model.bin").write_bytes(b"PK\x03\x04 the same weights, as torch.save wrote them")
    (single / "config.json").write_text("{}")
    _equal(jaxstow.load(single, as_numpy=True)["w"], TENSORS["lm_head.weight"])


def test_a_checkpoint_folder_with_a_stray_safetensors_file_points_to_the_manager(tmp_path):
    run = tmp_path / "run"
    with jaxstow.CheckpointManager(run) as manager:
        manager.save(1, {"params": {"w": jnp.ones(2)}, "opt": {"mu": jnp.zeros(2)}})
    save_file({"w": np.ones(2, np.float32)}, str(run / "export.safetensors"))
    with pytest.raises(IsAFolderError, match=r"is a checkpoint folder.*CheckpointManager\(.*\)\.restore\(\)"):
        jaxstow.load(run)
    with pytest.raises(IsAFolderError, match=r"step 1 of a checkpoint folder.*\.restore\(1\)"):
        jaxstow.open(run / "1")  # a step's item files are safetensors files too: still a step


def test_jaxstow_load_still_takes_names_and_transposed_with_a_warning_naming_their_home(folder):
    like = {"head": {"kernel": jnp.zeros((16, 8))}}
    names = {"lm_head.weight": "head/kernel"}
    with pytest.warns(DeprecationWarning, match=r"jaxstow\.load\(names=\.\.\., transposed=\.\.\.\) is deprecated: use "
                      r"jaxstow\.huggingface\.load") as caught:  # fmt: skip
        restored = jaxstow.load(folder, like, names=names, transposed={"lm_head.weight"})
    assert [warning.filename for warning in caught] == [__file__]  # the warning points at the caller's line
    _equal(restored["head"]["kernel"], TENSORS["lm_head.weight"].T)
    expected = huggingface.load(folder, like, names=names, transposed={"lm_head.weight"})
    _equal(restored["head"]["kernel"], expected["head"]["kernel"])
    jaxstow.save(folder.parent / "file.jxs", {"w": jnp.ones(2)})
    with pytest.warns(DeprecationWarning), pytest.raises(ArgumentError, match="is a file, not a folder"):
        jaxstow.load(folder.parent / "file.jxs", names=str)


def test_jaxstow_open_still_takes_names_and_transposed_with_a_warning_naming_their_home(folder):
    with pytest.warns(DeprecationWarning, match=r"jaxstow\.open\(transposed=\.\.\.\) is deprecated: use "
                      r"jaxstow\.huggingface\.open"):  # fmt: skip
        reader = jaxstow.open(folder, transposed={"lm_head.weight"})
    with reader:
        assert reader.info("lm_head.weight").shape == (16, 8)
        _equal(reader.read("lm_head.weight", np.s_[0]), TENSORS["lm_head.weight"][:, 0])
    with pytest.raises(ArgumentError, match="unexpected keyword argument 'nmes'"):
        jaxstow.open(folder, nmes=str)


def test_the_hugging_face_face_reads_folders_only_and_plain_folders_load_without_it(folder, tmp_path):
    with huggingface.open(folder, names=lambda name: name.replace(".", "/")) as reader:
        assert isinstance(reader, jaxstow.Reader)
        assert sorted(reader.paths) == sorted(name.replace(".", "/") for name in TENSORS)
    jaxstow.save(tmp_path / "model.jxs", {"w": jnp.ones(2)})
    for call in (huggingface.load, huggingface.open):
        with pytest.raises(ArgumentError, match=r"model\.jxs: is a file.*jaxstow\.load\("):
            call(tmp_path / "model.jxs")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plain folder, without names or transposed: no warning
        assert sorted(jaxstow.load(folder, as_numpy=True)) == sorted(TENSORS)
    assert jaxstow.huggingface.export_safetensors is jaxstow.export_safetensors


def test_a_folder_in_an_fsspec_store_of_folders_is_read_as_one(tmp_path):
    # memory:// lists a folder as an object of 0 bytes: it was read as a file, "too short for a safetensors header".
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://jaxstow-tests/{tmp_path.name}"
    jaxstow.save(tmp_path / "model.jxs", {"a": {"w": np.arange(6.0, dtype=np.float32).reshape(2, 3)}})
    try:
        jaxstow.export_safetensors(tmp_path / "model.jxs", f"{url}/hf")
        for loaded in (huggingface.load(f"{url}/hf", as_numpy=True), jaxstow.load(f"{url}/hf", as_numpy=True)):
            _equal(loaded["a.w"], np.arange(6.0, dtype=np.float32).reshape(2, 3))
        jaxstow.export_safetensors(f"{url}/hf", f"{url}/again")
        _equal(huggingface.load(f"{url}/again", as_numpy=True)["a.w"], np.arange(6.0, dtype=np.float32).reshape(2, 3))
    finally:
        fsspec.filesystem("memory").rm(f"/jaxstow-tests/{tmp_path.name}", recursive=True)


def test_the_index_of_a_folder_stands_for_its_folder_and_an_http_folder_is_explained(tmp_path):
    import functools
    import http.server
    import threading

    folder = _write(tmp_path / "hf")
    index = folder / "model.safetensors.index.json"
    np.testing.assert_array_equal(huggingface.load(index)["model.embed.weight"], TENSORS["model.embed.weight"])
    with huggingface.open(str(index)) as reader:
        assert sorted(reader.paths) == sorted(huggingface.load(folder))
    with pytest.raises(FormatError, match=r"is the index of a Hugging Face folder .*jaxstow\.huggingface\.load\("):
        jaxstow.load(index)

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for url in (f"http://127.0.0.1:{server.server_port}/", f"http://127.0.0.1:{server.server_port}/{index.name}"):
            with pytest.raises(ArgumentError, match="an http\\(s\\) URL names one file, and a folder there cannot be"):
                huggingface.load(url)
    finally:
        server.shutdown()
        server.server_close()


def test_an_index_that_is_no_object_and_names_that_meet_say_what_to_do(tmp_path):
    folder = _write(tmp_path / "hf")
    (folder / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(FormatError, match=r"is no index: a JSON object with a weight_map, not \[1, 2\]"):
        huggingface.load(folder)
    clash = tmp_path / "clash"
    clash.mkdir()
    save_file({"a.b": np.ones(2, np.float32), "a/b": np.zeros(2, np.float32)}, str(clash / "model.safetensors"))
    with pytest.raises(ArgumentError, match=r"without it: every dot a slash\) gives .* pass a names= that tells"):
        huggingface.load(clash, {"a": {"b": np.zeros(2, np.float32)}})


def test_a_shard_of_more_tensors_than_one_scattered_read_takes_loads(tmp_path):
    """A read of many small tensors in a row fills their buffers at once, and the system takes at most 1024 of
    them per call: a shard of 1,500 tensors was refused as "invalid argument"."""
    folder = tmp_path / "many"
    folder.mkdir()
    tensors = {f"layer{i}.bias": np.full(2, i, np.float32) for i in range(1500)}
    save_file(tensors, str(folder / "model.safetensors"))
    loaded = huggingface.load(folder, as_numpy=True)
    assert len(loaded) == 1500
    for name in ("layer0.bias", "layer1023.bias", "layer1024.bias", "layer1499.bias"):
        np.testing.assert_array_equal(loaded[name], tensors[name])


def test_an_interrupted_saves_leftover_beside_a_model_is_no_model_of_the_folder(tmp_path):
    save_file({"x": np.arange(3, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / ".m.jxs.jaxstow-tmp-12345-0123abcd-89abcdef").write_bytes(b"\x10" + bytes(7) + b"{" + bytes(20))
    np.testing.assert_array_equal(huggingface.load(tmp_path, as_numpy=True)["x"], np.arange(3, dtype=np.float32))
