"""Files and folders of other libraries, made by those libraries here: PyTorch (zip and legacy), pickle, equinox's
``tree_serialise_leaves``, flax's msgpack, orbax checkpoints, manager steps and manager folders. ``jaxstow.load``,
``jaxstow.open`` and ``jaxstow inspect`` name each and the call that reads it; ``from_format`` and ``jaxstow convert``
read those that can be read safely; nothing from a file is ever run, and no warning of another library reaches the
command line's output."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import equinox as eqx
import forked
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow import CheckpointManager
from jaxstow.cli import main
from jaxstow.errors import ArgumentError, FormatError, JaxstowError, PathError, StructureMismatchError

# Without torch the files of PyTorch are left out, and their tests skipped; torch is imported where it is used.
HAS_TORCH = importlib.util.find_spec("torch") is not None
NEEDS_TORCH = pytest.mark.skipif(not HAS_TORCH, reason="needs torch (pip install 'jaxstow[torch]')")
ocp = pytest.importorskip("orbax.checkpoint")
serialization = pytest.importorskip("flax.serialization")


def _state_dict():
    import torch

    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    return {"weight": layer.weight.detach().clone(), "bias": layer.bias.detach().to(torch.bfloat16)}


def _mlp(seed: int = 0):
    return eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(seed))


def _flax_params():
    return {"dense": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3), "bias": jnp.zeros(3, jnp.bfloat16)}}


def _orbax_quietly(function):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """One real file or folder of each kind, written by its own library."""
    folder = tmp_path_factory.mktemp("foreign")
    paths = {name: folder / name for name in ("net.pt", "legacy.pt", "data.pkl", "model.eqx", "params.msgpack")}
    if HAS_TORCH:
        import torch

        torch.save(_state_dict(), paths["net.pt"])
        torch.save(_state_dict(), paths["legacy.pt"], _use_new_zipfile_serialization=False)
    paths["data.pkl"].write_bytes(pickle.dumps({"w": np.ones(2)}))
    eqx.tree_serialise_leaves(paths["model.eqx"], _mlp())
    paths["params.msgpack"].write_bytes(serialization.to_bytes(_flax_params()))
    mesh = jax.make_mesh((4,), ("x",))
    tree = {"w": jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x"))), "step": 7}
    paths["orbax"] = folder / "orbax"
    _orbax_quietly(lambda: ocp.StandardCheckpointer().save(paths["orbax"], tree) or ocp.StandardCheckpointer().close())
    paths["run"] = folder / "run"
    options = ocp.CheckpointManagerOptions(best_fn=lambda metrics: metrics["loss"], best_mode="min")

    def manager_run():
        with ocp.CheckpointManager(paths["run"], options=options) as manager:
            for step in (10, 20, 30):
                items = ocp.args.Composite(
                    state=ocp.args.StandardSave({"w": np.full(3, step, np.float32), "b": jnp.ones(2)}),
                    extra=ocp.args.JsonSave({"epoch": step // 10, "note": "orbax"}),
                )
                manager.save(step, args=items, metrics={"loss": 1.0 / step})
            manager.wait_until_finished()

    _orbax_quietly(manager_run)
    paths["run/20"] = paths["run"] / "20"
    return paths


LABELS = [
    ("net.pt", "PyTorch zip", "jaxstow.load('{path}', from_format='torch')"),
    ("legacy.pt", "PyTorch legacy", "jaxstow.load('{path}', from_format='torch')"),
    ("data.pkl", "pickle", "jaxstow never unpickles"),
    ("model.eqx", "equinox tree_serialise_leaves stream", "jaxstow.load('{path}', like=model, from_format='equinox')"),
    ("params.msgpack", "flax msgpack", "jaxstow.load('{path}', from_format='flax')"),
    ("orbax", "orbax checkpoint", "jaxstow.load('{path}', from_format='orbax')"),
    ("run/20", "orbax manager step", "jaxstow.load('{path}', from_format='orbax')"),
    ("run", "orbax manager folder", "`jaxstow convert {path} {path}-jaxstow`"),
]


@pytest.mark.parametrize(
    ("name", "label", "call"),
    [pytest.param(*entry, id=entry[0], marks=NEEDS_TORCH if entry[0].endswith(".pt") else ()) for entry in LABELS],
)
def test_load_open_and_inspect_name_the_format_and_what_reads_it(files, capsys, name, label, call):
    path = str(files[name])
    expected = call.format(path=path)
    for attempt in (jaxstow.load, jaxstow.open, jaxstow.load_metadata):
        with pytest.raises((FormatError, PathError)) as caught:
            attempt(path)
        assert str(caught.value).startswith(f"{path}: is ") and label in str(caught.value)
        assert expected in str(caught.value), str(caught.value)
    for command in ("inspect", "verify"):  # an error (status 2), never damage (status 1)
        assert main([command, path]) == 2
        err = capsys.readouterr().err
        assert label in err and expected in err
    if files[name].is_file():  # a file object is named too, with the call for a file object
        with open(path, "rb") as file, pytest.raises(FormatError, match=label):
            jaxstow.load(file)


@pytest.mark.parametrize(
    ("make", "label"),
    [
        (lambda path: jaxstow.save(path / "a.jxs", {"w": np.ones(2)}) or path / "a.jxs", "jaxstow"),
        (lambda path: jaxstow.save(path / "a.npz", {"w": np.ones(2)}) or path / "a.npz", "npz from jaxstow"),
        (lambda path: np.savez(path / "b.npz", w=np.ones(2)) or path / "b.npz", "npz from numpy"),
        (
            lambda path: (
                __import__("safetensors.numpy").numpy.save_file({"w": np.ones(2)}, str(path / "c.st")) or path / "c.st"
            ),
            "plain safetensors",
        ),
    ],
    ids=["jaxstow", "jaxstow-npz", "numpy-npz", "safetensors"],
)
def test_inspect_labels_the_files_it_reads_exactly(tmp_path, capsys, make, label):
    path = make(tmp_path)
    assert main(["inspect", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == label


@NEEDS_TORCH
def test_pytorch_state_dicts_load_through_weights_only(files):
    expected = _state_dict()
    for name in ("net.pt", "legacy.pt"):
        loaded = jaxstow.load(files[name], from_format="torch", as_numpy=True)
        np.testing.assert_array_equal(loaded["weight"], expected["weight"].numpy())
        assert loaded["bias"].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(loaded["bias"].astype(np.float32), expected["bias"].float().numpy())
    like = {"weight": jax.ShapeDtypeStruct((2, 3), jnp.float32), "bias": jax.ShapeDtypeStruct((2,), jnp.bfloat16)}
    fitted = jaxstow.load(files["net.pt"], like, from_format="torch")
    assert isinstance(fitted["weight"], jax.Array) and fitted["bias"].dtype == jnp.bfloat16
    with pytest.raises(StructureMismatchError, match="'bias': in the file but not in the structure"):
        jaxstow.load(files["net.pt"], {"weight": like["weight"]}, from_format="torch")


def test_a_foreign_tree_is_restored_from_memory_never_saved_and_read_again(tmp_path):
    """The tree a foreign file holds is restored as it was read: no jaxstow file is written or parsed on the way."""
    path = tmp_path / "params.msgpack"
    path.write_bytes(serialization.to_bytes({**_flax_params(), "step": 3, "name": "adam"}))
    called: set[str] = set()

    def profile(frame, event, arg) -> None:
        if event == "call":
            called.add(frame.f_globals.get("__name__", ""))

    sys.setprofile(profile)
    try:
        loaded = jaxstow.load(path, from_format="flax", select=["dense/kernel", "step"], as_numpy=True)
    finally:
        sys.setprofile(None)
    assert loaded == {"dense": {"kernel": loaded["dense"]["kernel"]}, "step": 3}
    np.testing.assert_array_equal(loaded["dense"]["kernel"], _flax_params()["dense"]["kernel"])
    assert loaded["dense"]["kernel"].flags.writeable  # the caller's own array, as a load gives
    encoded = sorted(name for name in called if name.startswith(("jaxstow._write", "jaxstow._format.native")))
    assert encoded == [], f"the foreign tree went through a jaxstow file: {encoded}"
    like = {"dense": {"kernel": jax.ShapeDtypeStruct((3, 2), jnp.float32)}}
    with pytest.raises(StructureMismatchError) as caught:  # the errors of a restore name the file read
        jaxstow.load(path, like, from_format="flax", partial=True)
    assert str(path) in str(caught.value) and "'dense/kernel'" in str(caught.value)


_PEAK = """
import sys
import jax, jaxstow, torch

def high_water():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

path, mode = sys.argv[1], sys.argv[2]
torch.save({"warm": torch.ones(4)}, path + ".warm.pt")
jax.block_until_ready(jaxstow.load(path + ".warm.pt", from_format="torch", as_numpy=mode == "numpy"))  # warmed up
base = high_water()
restored = jaxstow.load(path, from_format="torch", as_numpy=mode == "numpy")
jax.block_until_ready(restored)
peak = high_water()
assert all(float(restored[f"layer{i}"][3, 5]) == i for i in range(len(restored)))
print(peak - base, sum(leaf.nbytes for leaf in jax.tree.leaves(restored)))
"""


@NEEDS_TORCH
@pytest.mark.parametrize("mode", ["jax", "numpy"])
def test_a_large_torch_file_is_held_once_while_it_loads(tmp_path, mode):
    """torch.load's tensors are the restored arrays' memory: 128 MiB of tensors grow a fresh process by 128 MiB (and
    some change), where saving them again into a buffer and reading that back took three times as much."""
    import torch

    path = str(tmp_path / "big.pt")
    torch.save({f"layer{i}": torch.full((512, 1024), float(i)) for i in range(64)}, path)
    done = subprocess.run([sys.executable, "-c", _PEAK, path, mode], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    grown, tree_bytes = map(int, done.stdout.split())
    assert tree_bytes == 128 << 20
    assert grown >= 0.9 * tree_bytes, f"loading {tree_bytes} bytes grew the process by only {grown}"
    assert grown <= tree_bytes + (64 << 20), f"loading {tree_bytes} bytes of tensors grew the process by {grown}"


class _Payload:
    """An object whose unpickling would run code: creating a marker folder."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@NEEDS_TORCH
def test_no_code_of_a_file_is_run(tmp_path):
    import torch

    marker = tmp_path / "code-ran"
    torch.save({"w": torch.ones(2), "evil": _Payload(str(marker))}, tmp_path / "evil.pt")
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps(_Payload(str(marker))))
    with pytest.raises(FormatError, match="not a PyTorch file of tensors that loads without unpickling objects"):
        jaxstow.load(tmp_path / "evil.pt", from_format="torch")
    for name in ("evil.pt", "evil.pkl"):
        with pytest.raises(FormatError):
            jaxstow.load(tmp_path / name)
        assert main(["inspect", str(tmp_path / name)]) == 2
    assert not marker.exists()


@NEEDS_TORCH
def test_a_torch_file_torch_refuses_is_named_by_its_reason_never_by_advice_to_unpickle_it(tmp_path):
    import torch

    path = tmp_path / "protocol0.pt"
    torch.save({"a": torch.arange(5.0)}, path, pickle_protocol=0, _use_new_zipfile_serialization=False)
    try:
        expected = torch.load(path, weights_only=True)["a"].numpy()
    except Exception:  # pickle.UnpicklingError from torch 2.6 on (weights_only's unpickler reads no protocol 0)
        expected = None
    if expected is not None:  # a torch that reads it: so does jaxstow
        np.testing.assert_array_equal(jaxstow.load(path, from_format="torch", as_numpy=True)["a"], expected)
        return
    with pytest.raises(FormatError) as caught:
        jaxstow.load(path, from_format="torch")
    # was: "(UnpicklingError: In PyTorch 2.6, we changed the default value of the `weights_only` argument ...)"
    assert "without unpickling objects (UnpicklingError: " in str(caught.value)
    assert "weights_only" not in str(caught.value) and "PyTorch 2.6" not in str(caught.value), caught.value


@NEEDS_TORCH
def test_a_torch_size_loads_as_its_tuple_and_an_object_convert_cannot_write_names_the_source(tmp_path, capsys):
    import torch

    torch.save({"shape": torch.Size([2, 3]), "w": torch.ones(2)}, tmp_path / "sized.pt")
    assert jaxstow.load(tmp_path / "sized.pt", from_format="torch", as_numpy=True)["shape"] == (2, 3)
    assert main(["convert", str(tmp_path / "sized.pt"), str(tmp_path / "sized.jxs")]) == 0
    assert jaxstow.load(tmp_path / "sized.jxs", as_numpy=True)["shape"] == (2, 3)
    torch.save({"dtype": torch.float32, "w": torch.ones(2)}, tmp_path / "typed.pt")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "typed.pt"), str(tmp_path / "typed.jxs")]) == 2
    # was: "cannot save leaf 'dtype' of .../typed.jxs: ... register it with jaxstow.saveable(obj, name=...)"
    assert capsys.readouterr().err.strip() == (
        f"jaxstow convert: leaf 'dtype' of {tmp_path / 'typed.pt'}: holds torch.float32, which a jaxstow file cannot "
        "hold: convert a file of tensors, numbers and strings"
    )
    assert not (tmp_path / "typed.jxs").exists()


@NEEDS_TORCH
def test_a_torch_dict_of_keys_that_do_not_sort_is_a_format_error_naming_it(tmp_path):
    import torch

    torch.save({"net": {"weight": torch.ones(2), 0: torch.zeros(1)}}, tmp_path / "mixed.pt")  # torch loads it
    for options in ({}, {"as_numpy": True}):
        with pytest.raises(
            FormatError, match=r"leaf 'net' of .*mixed\.pt: a dict whose keys are of types \['int', 'str'\]"
        ):
            jaxstow.load(tmp_path / "mixed.pt", from_format="torch", **options)
    assert main(["convert", str(tmp_path / "mixed.pt"), str(tmp_path / "mixed.jxs")]) == 2


def test_flax_msgpack_loads_as_nested_dicts_chunked_arrays_included(tmp_path, monkeypatch):
    loaded = jaxstow.load(io.BytesIO(serialization.to_bytes(_flax_params())), from_format="flax", as_numpy=True)
    np.testing.assert_array_equal(loaded["dense"]["kernel"], _flax_params()["dense"]["kernel"])
    assert loaded["dense"]["bias"].dtype == ml_dtypes.bfloat16
    scalars = {"step": np.int64(7), "lr": 0.5, "z": 1 + 2j, "name": "adam", "big": np.arange(100, dtype=np.int32)}
    monkeypatch.setattr(serialization, "MAX_CHUNK_SIZE", 64)  # flax then writes "big" in chunks of 16 elements
    (tmp_path / "chunked.msgpack").write_bytes(serialization.to_bytes(scalars))
    loaded = jaxstow.load(tmp_path / "chunked.msgpack", from_format="flax", as_numpy=True)
    assert loaded["step"] == 7 and loaded["lr"] == 0.5 and loaded["z"] == 1 + 2j and loaded["name"] == "adam"
    np.testing.assert_array_equal(loaded["big"], np.arange(100, dtype=np.int32))
    assert serialization.msgpack_restore((tmp_path / "chunked.msgpack").read_bytes())["big"].shape == (100,)


def _as_map32(data: bytes) -> bytes:
    """A msgpack map16 (``0xde``, a 2-byte count) written as a map32 (``0xdf``, a 4-byte count): the header flax gives
    a map of 65536 keys or more, the same file otherwise."""
    assert data[0] == 0xDE
    return b"\xdf\0\0" + data[1:]


# A map of 16 or more keys starts otherwise (map16, map32).
@pytest.mark.parametrize(("keys", "header"), [(15, "fixmap"), (16, "map16"), (16, "map32")])
def test_a_flax_msgpack_file_of_many_keys_is_recognised_and_converted(tmp_path, capsys, keys, header):
    params = {f"layer_{i}": np.full(2, i, np.float32) for i in range(keys)}
    data = serialization.to_bytes(params)
    (tmp_path / "params.msgpack").write_bytes(_as_map32(data) if header == "map32" else data)
    with pytest.raises(FormatError, match=r"is a flax msgpack file .* from_format='flax'"):
        jaxstow.load(tmp_path / "params.msgpack")  # was "not a jaxstow, safetensors or npz file"
    assert main(["convert", str(tmp_path / "params.msgpack"), str(tmp_path / "params.jxs")]) == 0
    assert jaxstow.load(tmp_path / "params.jxs", as_numpy=True)["layer_15" if keys > 15 else "layer_14"][0] > 0


def _packed_array(shape, dtype: str, buffer: bytes, code: int = 1) -> bytes:
    msgpack = pytest.importorskip("msgpack")
    return msgpack.packb({"w": msgpack.ExtType(code, msgpack.packb((shape, dtype, buffer)))})


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (_packed_array((2,), "float32", b"\0" * 8, code=99), "a msgpack extension of type 99"),
        (_packed_array((2,), "object", b"\0" * 16), "unknown dtype b'object'"),
        (_packed_array((2,), "<f4", b"\0" * 8), "unknown dtype b'<f4'"),
        (_packed_array((3,), "float32", b"\0" * 8), r"float32\[3\] holds 12 bytes, but its data is 8 bytes"),
        (_packed_array((-1,), "float32", b"\0" * 8), "or shape"),
        (_packed_array(5, "float32", b"\0" * 8), "or shape 5"),
        # a count where the bytes belong: numpy would make (and zero) 256 MiB of it before finding the size wrong
        (_packed_array((2,), "float32", 2**28), r"float32\[2\] holds 8 bytes, but its data is 268435456"),
        (b"\x82\xa1w", "not a flax msgpack file"),
    ],
    ids=[
        "unknown-extension",
        "object-dtype",
        "numpy-spelling",
        "short-buffer",
        "negative-shape",
        "shape-of-no-list",
        "count-for-bytes",
        "truncated",
    ],
)
def test_crafted_msgpack_is_a_format_error(data, problem):
    with pytest.raises(FormatError, match=problem):
        jaxstow.load(io.BytesIO(data), from_format="flax")


def test_equinox_streams_load_into_like(files):
    expected = _mlp()
    for like in (_mlp(seed=1), eqx.filter_eval_shape(_mlp, 1)):
        loaded = jaxstow.load(files["model.eqx"], like, from_format="equinox")
        for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(expected), strict=True):
            np.testing.assert_array_equal(got, want)
    as_numpy = jaxstow.load(files["model.eqx"], _mlp(seed=1), from_format="equinox", as_numpy=True)
    assert isinstance(as_numpy.layers[0].weight, np.ndarray)
    with pytest.raises(ValueError, match="pass like="):
        jaxstow.load(files["model.eqx"], from_format="equinox")
    with pytest.raises(FormatError, match="holds more than like's leaves"):
        jaxstow.load(files["model.eqx"], (expected.layers[0].weight, expected.layers[0].bias), from_format="equinox")
    with pytest.raises(FormatError, match="does not fit like"):
        jaxstow.load(files["model.eqx"], eqx.nn.MLP(3, 2, 8, 3, key=jax.random.key(0)), from_format="equinox")
    with pytest.raises(JaxstowError, match="without the options"):
        jaxstow.load(files["model.eqx"], _mlp(seed=1), from_format="equinox", select=["layers/**"])
    bf16 = jax.tree.map(lambda leaf: leaf.astype(jnp.bfloat16) if eqx.is_inexact_array(leaf) else leaf, _mlp(seed=1))
    # was: "does not fit like (... has changed dtype from bfloat16 in `like` to float32 on disk.)", cast=True unheard
    with pytest.raises(ArgumentError, match=r"from_format='equinox' reads into like, without the options \['cast'\]"):
        jaxstow.load(files["model.eqx"], bf16, from_format="equinox", cast=True)


def test_orbax_checkpoints_and_manager_steps_load_through_orbax(files):
    checkpoint = jaxstow.load(files["orbax"], from_format="orbax", as_numpy=True)
    assert checkpoint["step"] == 7 and checkpoint["w"].tolist() == list(range(8))  # saved over 4 devices
    assert checkpoint["w"].flags.writeable
    step = jaxstow.load(files["run/20"], from_format="orbax", as_numpy=True)
    assert step["extra"] == {"epoch": 2, "note": "orbax"} and step["state"]["w"].tolist() == [20.0] * 3
    with pytest.raises(FormatError, match="is an orbax manager folder, of several steps"):
        jaxstow.load(files["run"], from_format="orbax")
    with pytest.raises(ValueError, match="from_format must be one of"):
        jaxstow.load(files["orbax"], from_format="tensorflow")


def _convert(*args: object) -> subprocess.CompletedProcess[str]:
    done = forked.run(
        [sys.executable, "-m", "jaxstow", "convert", *map(str, args)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_convert_an_orbax_manager_folder_into_a_checkpoint_folder_with_its_steps_and_metrics(files, tmp_path):
    done = _convert(files["run"], tmp_path / "run")
    assert done.stderr == ""  # no warning of orbax or absl
    assert (
        done.stdout.strip()
        == f"{files['run']} (orbax manager folder) -> {tmp_path / 'run'} (jaxstow checkpoint folder): 3 steps"
    )
    theirs = _orbax_quietly(lambda: ocp.CheckpointManager(files["run"]))
    with CheckpointManager(tmp_path / "run") as ours:
        assert ours.steps() == list(theirs.all_steps()) == [10, 20, 30]
        for step in ours.steps():
            assert ours.metrics(step) == theirs.metrics(step) == {"loss": 1.0 / step}
            restored = ours.restore(step, as_numpy=True)
            assert restored["extra"] == {"epoch": step // 10, "note": "orbax"}
            assert restored["state"]["w"].tolist() == [float(step)] * 3
        assert ours.best_step("loss") == theirs.best_step() == 30
    theirs.close()


def test_converting_a_manager_folder_is_all_or_nothing_and_never_over_steps_already_there(files, tmp_path):
    from tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "small", "1m") as disk:
        (disk / "filler").write_bytes(bytes(1_000_000))  # room for about two of the three steps
        convert = [sys.executable, "-m", "jaxstow", "convert", str(files["run"]), str(disk / "run")]
        full = forked.run(convert, capture_output=True, text=True, timeout=300)
        assert full.returncode == 2 and full.stderr.count("no space left on the device") == 1, full.stderr
        assert "Traceback" not in full.stderr and CheckpointManager(disk / "run").steps() == []
        (disk / "filler").unlink()
        _convert(files["run"], disk / "run")  # the same command again, once there is room
        assert CheckpointManager(disk / "run").steps() == [10, 20, 30]
        again = forked.run(convert, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2
    assert again.stderr.strip().endswith(
        "holds steps 10, 20, 30 already: convert into a new folder, or remove it first"
    )


def test_a_manager_folders_conversion_killed_midway_leaves_no_run_and_can_be_run_again(files, tmp_path):
    import glob
    import signal
    import time

    convert = [sys.executable, "-m", "jaxstow", "convert", str(files["run"]), str(tmp_path / "run")]
    process = forked.Popen(convert, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while process.poll() is None and not glob.glob(str(tmp_path / ".run*" / "10")) + glob.glob(
        str(tmp_path / "run/10")
    ):
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)  # once its first step is committed (or after it ended)
    process.communicate()
    assert CheckpointManager(tmp_path / "run").steps() in ([], [10, 20, 30])  # whole, or no run at all
    _convert(files["run"], tmp_path / "run")  # the same command again
    assert CheckpointManager(tmp_path / "run").steps() == [10, 20, 30]


def test_convert_a_manager_step_every_item_and_other_files(files, tmp_path, capsys):
    done = _convert(files["run/20"], tmp_path / "step.jxs")
    assert done.stderr == "" and "(orbax manager step) -> " in done.stdout and ": 4 leaves" in done.stdout
    assert jaxstow.load_metadata(tmp_path / "step.jxs") == {"orbax_step": 20, "metrics": {"loss": 0.05}}
    assert jaxstow.load(tmp_path / "step.jxs")["extra"]["note"] == "orbax"
    for name, label in [
        ("orbax", "orbax checkpoint"),
        *([("legacy.pt", "PyTorch legacy")] if HAS_TORCH else []),
        ("params.msgpack", "flax msgpack"),
    ]:
        done = _convert(files[name], tmp_path / f"{name}.jxs")
        assert done.stderr == "" and f"({label}) -> " in done.stdout
    np.testing.assert_array_equal(
        jaxstow.load(tmp_path / "params.msgpack.jxs", as_numpy=True)["dense"]["kernel"],
        _flax_params()["dense"]["kernel"],
    )
    for name in ("model.eqx", "data.pkl"):
        assert main(["convert", str(files[name]), str(tmp_path / "x.jxs")]) == 2
        assert "jaxstow convert cannot read" in capsys.readouterr().err and not (tmp_path / "x.jxs").exists()


def _msgpack_array(array: np.ndarray) -> object:
    import msgpack

    return msgpack.ExtType(1, msgpack.packb((array.shape, array.dtype.name, array.tobytes())))


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"w": {"__msgpack_chunked_array__": True}}, r"a chunked array that is not flax's \(KeyError"),
        (
            {"w": {"__msgpack_chunked_array__": True, "shape": {"0": 5}, "chunks": {"0": _msgpack_array(np.ones(3))}}},
            r"a chunked array that is not flax's \(ValueError: 'cannot reshape",
        ),
        ({"w": {"__msgpack_chunked_array__": True, "shape": {"0": 0}, "chunks": {}}}, "of no array or of several"),
        (
            {
                "w": {
                    "__msgpack_chunked_array__": True,
                    "shape": {"0": 4},
                    "chunks": {"0": _msgpack_array(np.ones(2, np.float32)), "1": _msgpack_array(np.ones(2, np.int64))},
                }
            },
            "of no array or of several dtypes",
        ),
        ({1: _msgpack_array(np.ones(1)), "a": _msgpack_array(np.ones(1))}, "whose keys are of types"),
    ],
    ids=["no-shape", "shape-of-other-size", "no-chunks", "chunks-of-two-dtypes", "keys-that-do-not-sort"],
)
def test_a_flax_msgpack_file_flax_never_writes_is_a_format_error(tmp_path, tree, message):
    import msgpack

    path = tmp_path / "hostile.msgpack"
    path.write_bytes(msgpack.packb(tree))
    with pytest.raises(FormatError, match=message):
        jaxstow.load(path, from_format="flax")


@pytest.mark.parametrize("marker", [1, False, None, "yes"])
def test_a_chunked_array_marked_by_any_value_is_joined_as_flax_joins_it(tmp_path, marker):
    import flax.serialization
    import msgpack

    chunks = {"0": _msgpack_array(np.ones(2, np.float32)), "1": _msgpack_array(np.zeros(1, np.float32))}
    data = msgpack.packb({"w": {"__msgpack_chunked_array__": marker, "shape": {"0": 3}, "chunks": chunks}})
    (tmp_path / "chunked.msgpack").write_bytes(data)
    loaded = jaxstow.load(tmp_path / "chunked.msgpack", from_format="flax", as_numpy=True)
    # was: a dict of the raw pieces ({'chunks': ..., 'shape': ...}) where flax gives the array
    np.testing.assert_array_equal(loaded["w"], flax.serialization.msgpack_restore(data)["w"])
    np.testing.assert_array_equal(loaded["w"], [1.0, 1.0, 0.0])


def test_a_torch_file_holding_a_tensor_of_no_array_is_a_format_error_quoting_it_briefly(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"s": torch.eye(100).to_sparse()}, tmp_path / "sparse.pt")
    with pytest.raises(FormatError, match=r"leaf 's' of .*sparse\.pt: holds tensor\(.*, a tensor of layout") as caught:
        jaxstow.load(tmp_path / "sparse.pt", from_format="torch")
    assert len(str(caught.value)) < 400 and "cannot save" not in str(caught.value)


def test_a_flax_file_nested_past_what_jaxstow_holds_is_refused_naming_it(tmp_path):
    msgpack = pytest.importorskip("msgpack")
    nested: dict = {"v": 1}
    for _ in range(500):
        nested = {"k": nested}
    path = tmp_path / "deep.msgpack"
    path.write_bytes(msgpack.packb(nested))
    with pytest.raises(FormatError, match=r"deep\.msgpack: nests dicts and lists more than 400 levels deep"):
        jaxstow.load(path, from_format="flax")


def test_a_flax_file_of_lists_nested_past_what_jaxstow_holds_is_refused_naming_it(tmp_path):
    msgpack = pytest.importorskip("msgpack")
    nested: list = [1]
    for _ in range(450):  # within msgpack's own bound, past the 400 levels of a jaxstow file
        nested = [{"k": nested}]
    path = tmp_path / "lists.msgpack"
    path.write_bytes(msgpack.packb({"params": nested}))
    with pytest.raises(
        FormatError, match=r"leaf 'params/0/k/.*' of .*lists\.msgpack: nests dicts and lists more than 400"
    ):
        jaxstow.load(path, from_format="flax")


def test_a_torch_file_of_lists_nested_past_what_jaxstow_holds_is_refused_naming_it(tmp_path):
    torch = pytest.importorskip("torch")
    nested: list = [torch.zeros(1)]
    for _ in range(900):
        nested = [nested]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # torch.save pickles recursively: a file made elsewhere, as deep as it likes
    try:
        torch.save({"layers": nested}, tmp_path / "deep.pt")
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(FormatError, match=r"leaf 'layers/0/0/.*' of .*deep\.pt: nests dicts and lists more than 400"):
        jaxstow.load(tmp_path / "deep.pt", from_format="torch")


def test_tied_weights_and_views_of_a_torch_file_come_back_as_leaves_of_their_own(tmp_path):
    torch = pytest.importorskip("torch")
    weights = torch.arange(6.0)
    torch.save(
        {"embed": weights, "lm_head": weights, "row": weights[2:4], "turned": weights.view(2, 3).t()},
        tmp_path / "tied.pt",
    )
    loaded = jaxstow.load(tmp_path / "tied.pt", from_format="torch", as_numpy=True)
    loaded["embed"][2] = 99.0  # a leaf written to changes no other, as with a jaxstow file's leaves
    assert loaded["lm_head"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and loaded["row"].tolist() == [2.0, 3.0]
    assert loaded["turned"].tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


def test_an_npz_of_no_arrays_loads_empty_as_numpy_reads_it(tmp_path, capsys):
    path = tmp_path / "empty.npz"
    np.savez(path)
    assert dict(np.load(path)) == {} and jaxstow.load(path) == {}
    with jaxstow.open(path) as reader:
        assert reader.paths == []
    assert main(["verify", str(path)]) == 0
    assert "1 file intact" in capsys.readouterr().out
