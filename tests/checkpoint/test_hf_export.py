"""Checkpoint steps and files exported as Hugging Face sharded safetensors folders, read back by safetensors, torch
and jaxstow; a step saved by four real ``jax.distributed`` processes is joined whole."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import forked
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

import jaxstow
from jaxstow import CheckpointManager
from jaxstow.cli import main
from jaxstow.errors import ArgumentError, FormatError, PathError

WORKER = Path(__file__).parents[1] / "distributed" / "worker.py"
ROWS, COLUMNS = 512, 384  # the worker's arrays


def _values(step: int) -> dict[str, np.ndarray]:
    base = np.arange(ROWS * COLUMNS, dtype=np.float32).reshape(ROWS, COLUMNS) + 1000 * step
    return {"params.w": base, "params.b": base[0] * 2, "params.r": base[:8, 0].copy(), "meta.count": np.int32(step)}


@pytest.fixture(scope="module")
def saved_by_four(tmp_path_factory) -> Path:
    """Steps 1 and 2 saved by 4 real processes of one CPU device each, their arrays sharded over a 2x2 mesh."""
    folder = tmp_path_factory.mktemp("four-processes") / "run"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    processes = [
        forked.Popen(
            [sys.executable, str(WORKER), "save", str(index), "4", "1", str(port), str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for index in range(4)
    ]
    for process in processes:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, f"{out}\n{err[-3000:]}"
    return folder


def _read_back(folder: Path) -> dict[str, np.ndarray]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    tensors = {}
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / file), "np") as opened:
            assert opened.metadata() == {"format": "pt"}
            tensors |= {name: opened.get_tensor(name) for name in opened.keys()}  # noqa: SIM118
    assert sorted(tensors) == sorted(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(array.nbytes for array in tensors.values())
    return tensors


def test_a_step_of_four_processes_is_joined_whole(saved_by_four, tmp_path):
    step = saved_by_four / "2"
    assert (step / "params.p3.safetensors").exists()  # the shards of process 3
    exported = jaxstow.export_safetensors(step, tmp_path / "hf")
    assert exported.files == ["model-00001-of-00001.safetensors"] and exported.tensors == 4
    tensors = _read_back(tmp_path / "hf")
    for name, want in _values(2).items():
        np.testing.assert_array_equal(tensors[name], want)
    torch_file = pytest.importorskip("safetensors.torch")
    loaded = torch_file.load_file(str(tmp_path / "hf" / "model-00001-of-00001.safetensors"))
    np.testing.assert_array_equal(loaded["params.w"].numpy(), _values(2)["params.w"])
    back = jaxstow.load(tmp_path / "hf", {"params": {"w": jnp.zeros((ROWS, COLUMNS))}}, partial=True)
    np.testing.assert_array_equal(back["params"]["w"], _values(2)["params.w"])


def test_one_item_unprefixed_and_split_by_size(saved_by_four, tmp_path):
    exported = jaxstow.export_safetensors(saved_by_four / "1", tmp_path / "hf", item="params", max_shard_size="300KB")
    assert exported.files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == dict(zip("brw", exported.files[:1] * 2 + exported.files[1:], strict=True))
    tensors = _read_back(tmp_path / "hf")
    assert sorted(tensors) == ["b", "r", "w"]
    np.testing.assert_array_equal(tensors["w"], _values(1)["params.w"])


def test_shards_hold_at_most_the_size_asked(tmp_path):
    rng = np.random.default_rng(3)
    tree = {f"layer{i}": {"kernel": rng.standard_normal((100, 100)).astype(np.float32)} for i in range(5)}
    tree["big"] = rng.standard_normal((300, 100)).astype(ml_dtypes.bfloat16)  # 60 kB: alone in its file
    tree["step"] = 7
    jaxstow.save(tmp_path / "model.jxs", tree)
    exported = jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / "hf", max_shard_size="85kB")
    assert exported.left_out == ["step"]
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    per_file: dict[str, int] = {}
    for name, file in index["weight_map"].items():
        per_file[file] = per_file.get(file, 0) + (60_000 if name == "big" else 40_000)
    assert sorted(per_file) == exported.files and len(exported.files) == 4
    assert all(size <= 85_000 for size in per_file.values())
    tensors = _read_back(tmp_path / "hf")
    np.testing.assert_array_equal(tensors["layer3.kernel"], tree["layer3"]["kernel"])
    assert tensors["big"].dtype == ml_dtypes.bfloat16
    back = jaxstow.load(tmp_path / "hf", as_numpy=True)
    np.testing.assert_array_equal(back["big"].view(np.uint16), tree["big"].view(np.uint16))


def test_a_several_item_step_of_one_process(tmp_path):
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(3, {"params": {"w": jnp.arange(6.0)}, "opt": {"mu": jnp.ones(2, jnp.bfloat16)}})
    exported = jaxstow.export_safetensors(tmp_path / "run" / "3", tmp_path / "hf", names=lambda path: path.upper())
    assert exported.tensors == 2
    assert sorted(_read_back(tmp_path / "hf")) == ["OPT/MU", "PARAMS/W"]


def test_the_item_of_a_step_of_one_item_names_no_tensor(tmp_path):
    """Prefixes keep the items of a step with several apart; a step of one item needs none."""
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"params": {"layer": {"w": jnp.arange(4.0)}}})
    jaxstow.export_safetensors(tmp_path / "run" / "1", tmp_path / "hf")
    assert sorted(_read_back(tmp_path / "hf")) == ["layer.w"]


def test_an_item_of_one_array_is_named_by_its_item(tmp_path):
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"w": jnp.arange(4), "b": jnp.ones(2)})
    jaxstow.export_safetensors(tmp_path / "run" / "1", tmp_path / "hf")
    assert sorted(_read_back(tmp_path / "hf")) == ["b", "w"]
    assert jaxstow.load(tmp_path / "hf", like={"w": jnp.zeros(4, jnp.int32), "b": jnp.zeros(2)})["w"].tolist() == [
        0,
        1,
        2,
        3,
    ]


def test_errors_leave_no_folder(tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"a": {"b": jnp.ones(2)}, "a.b": jnp.zeros(2), "q": jnp.zeros(2, "int4")})
    with pytest.raises(ArgumentError, match=r"'a\.b' and 'a/b'|'a/b' and 'a\.b'"):
        jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / "hf")
    with pytest.raises(ArgumentError, match="int4"):
        jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / "hf", names=lambda p: None if p == "a.b" else p)
    with pytest.raises(ArgumentError, match="max_shard_size"):
        jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / "hf", max_shard_size="five")
    assert sorted(os.listdir(tmp_path)) == ["model.jxs"]
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "other").write_text("")
    with pytest.raises(PathError, match="exists already"):
        jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / "hf", names=lambda p: p if p == "a.b" else None)


def test_names_as_a_mapping_and_names_that_are_no_strings(tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"w": np.arange(4.0), "b": np.zeros(2)})
    exported = jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / "hf", names={"w": "dense.weight"})
    assert exported.tensors == 1 and exported.left_out == ["b"]
    assert list(_read_back(tmp_path / "hf")) == ["dense.weight"]
    for wrong, message in [
        (lambda path: path.encode(), r"names= gives '\w' the name b'\w': a string"),
        (lambda path: 5, r"the name 5: a string"),
        ([("w", "weight")], r"names= takes a function of a leaf's path or a mapping"),
        ({"nothing": "x"}, r"names= maps paths the source lacks: \['nothing'\]"),
    ]:
        with pytest.raises(ArgumentError, match=message):
            jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / "other", names=wrong)
    # a name safetensors' parser cannot read (a lone surrogate) is refused, naming the folder's file, not a temporary
    with pytest.raises(FormatError, match=r"of .*other/model-00001-of-00001\.safetensors: .* lone surrogate"):
        jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / "other", names=lambda path: path + "\ud800")
    assert sorted(os.listdir(tmp_path)) == ["hf", "model.jxs"]


def test_the_command(saved_by_four, tmp_path, capsys):
    assert main(["export", str(saved_by_four / "2"), str(tmp_path / "hf"), "--max-shard-size", "500KB"]) == 0
    out = capsys.readouterr().out
    assert "4 tensors" in out and "in 2 files" in out
    np.testing.assert_array_equal(_read_back(tmp_path / "hf")["params.b"], _values(2)["params.b"])
    assert main(["export", str(saved_by_four / "2"), str(tmp_path / "other"), "--item", "nope"]) == 2
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "other")]) == 2
    assert main(["export", str(saved_by_four / "2"), str(tmp_path / "hf")]) == 2
    assert main(["export", str(saved_by_four / "2"), str(tmp_path / "other"), "--max-shard-size", "big"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("jaxstow export: ") for line in lines)
    assert "no item 'nope'" in lines[0] and "exists already" in lines[2] and "max_shard_size" in lines[3]
    assert not (tmp_path / "other").exists()


def test_export_to_and_load_from_s3(s3_server, tmp_path):
    tree = {"dense": {"kernel": np.arange(600.0, dtype=np.float32).reshape(20, 30)}, "bias": np.ones(30, np.float32)}
    jaxstow.save(tmp_path / "model.jxs", tree)
    url = s3_server.url("exported")
    options = s3_server.storage_options
    exported = jaxstow.export_safetensors(tmp_path / "model.jxs", url, max_shard_size="1KB", storage_options=options)
    assert len(exported.files) == 2
    back = jaxstow.load(url, {"dense": {"kernel": np.zeros((20, 30), np.float32)}, "bias": np.zeros(30, np.float32)},
                        storage_options=options)  # fmt: skip
    np.testing.assert_array_equal(back["dense"]["kernel"], tree["dense"]["kernel"])
    with pytest.raises(PathError, match="exists already"):
        jaxstow.export_safetensors(tmp_path / "model.jxs", url, storage_options=options)


_MEASURE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import jaxstow

    def high_water():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

    source, out = sys.argv[1], sys.argv[2]
    jaxstow.save(out + ".jxs", {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    jaxstow.export_safetensors(out + ".jxs", out + "-warm", max_shard_size=16)  # every code path warmed up
    base = high_water()
    jaxstow.export_safetensors(source, out, max_shard_size="32MiB")
    print(high_water() - base)
    """
)


def test_the_export_holds_one_file_of_tensors_at_a_time(tmp_path):
    layers = {f"layer{i}": np.full((4096, 1024), i, np.float32) for i in range(8)}  # 16 MiB each, 128 MiB in all
    jaxstow.save(tmp_path / "big.jxs", layers)
    del layers
    result = forked.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path / "big.jxs"), str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        check=True,
    )
    grown = int(result.stdout.split()[-1])
    assert len(os.listdir(tmp_path / "hf")) == 5  # 4 files of two layers, and the index
    assert (16 << 20) <= grown <= (32 << 20) + (16 << 20), f"exporting 128 MiB in files of 32 MiB grew it by {grown}"


def test_the_metadata_saved_with_a_file_or_each_item_goes_to_the_index(tmp_path):
    from jaxstow.huggingface import export_safetensors

    jaxstow.save(tmp_path / "model.jxs", {"w": np.ones(3, np.float32)}, metadata={"epoch": 3, "tags": ["a"]})
    export_safetensors(tmp_path / "model.jxs", tmp_path / "file-out")
    index = json.loads((tmp_path / "file-out" / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": 12, "jaxstow_metadata": {"epoch": 3, "tags": ["a"]}}
    with jaxstow.open(tmp_path / "file-out") as reader:
        assert reader.metadata["jaxstow_metadata"] == {"epoch": 3, "tags": ["a"]}

    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"params": {"w": np.ones(2)}, "opt": {"m": np.zeros(2)}})
    export_safetensors(tmp_path / "run" / "1", tmp_path / "step-out")
    index = json.loads((tmp_path / "step-out" / "model.safetensors.index.json").read_text())
    assert set(index["metadata"]) == {"total_size"}  # items saved without metadata: nothing more


def test_an_item_of_one_array_is_named_by_the_item_and_a_nameless_array_asks_for_a_name(tmp_path):
    from jaxstow.huggingface import export_safetensors

    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"emb": np.arange(6.0, dtype=np.float32).reshape(2, 3)}, metadata={"lr": 0.1})
        manager.save(2, {"emb": np.ones(4, np.float32), "head": {"w": np.zeros(2, np.float32)}})
        manager.save(3, np.arange(3.0, dtype=np.float32))
    export_safetensors(tmp_path / "run" / "1", tmp_path / "one")
    index = json.loads((tmp_path / "one" / "model.safetensors.index.json").read_text())
    assert list(index["weight_map"]) == ["emb"]
    assert index["metadata"]["jaxstow_step_metadata"] == {"lr": 0.1}  # the step's own metadata is kept too
    restored = jaxstow.load(tmp_path / "one", like={"emb": np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(restored["emb"], np.arange(6.0).reshape(2, 3))
    export_safetensors(tmp_path / "run" / "2", tmp_path / "item", item="emb")
    assert list(json.loads((tmp_path / "item" / "model.safetensors.index.json").read_text())["weight_map"]) == ["emb"]

    jaxstow.save(tmp_path / "bare.jxs", np.arange(5.0, dtype=np.float32))
    for source in (tmp_path / "bare.jxs", tmp_path / "run" / "3"):
        with pytest.raises(ArgumentError, match="holds one array, which has no name to export it by"):
            export_safetensors(source, tmp_path / "nameless")
        assert not (tmp_path / "nameless").exists()
    export_safetensors(tmp_path / "bare.jxs", tmp_path / "named", names={"": "weight"})
    assert list(json.loads((tmp_path / "named" / "model.safetensors.index.json").read_text())["weight_map"]) == [
        "weight"
    ]
    with pytest.raises(ArgumentError, match="as a path or URL"):
        export_safetensors({"w": np.ones(3)}, tmp_path / "tree")


def test_names_that_give_a_leaf_the_empty_name_say_so_not_that_the_file_holds_one_array(tmp_path):
    jaxstow.save(tmp_path / "two.jxs", {"w": np.zeros(2, np.float32), "b": np.ones(2, np.float32)})
    for names in ({"w": "", "b": "b"}, lambda path: "" if path == "w" else path):
        with pytest.raises(ArgumentError) as info:
            jaxstow.export_safetensors(tmp_path / "two.jxs", tmp_path / "hf", names=names)
        assert str(info.value) == (
            "names= gives the leaf 'w' the empty name, which no tensor may have: give it a name, or None to leave it out"
        )
        assert not (tmp_path / "hf").exists()
