"""The ``jaxstow`` command on real files and folders, each command in a process of its own (tests/support/forked_cli.py);
the terminal case runs ``python -m jaxstow`` itself."""

from __future__ import annotations

import json
import os
import pty
import struct
import subprocess
import sys

import equinox as eqx
import forked_cli
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxstow
from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.cli import main


def jaxstow_command(*args: object, check: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m jaxstow ARGS``; ``check`` is the exit status expected."""
    done = forked_cli.jaxstow_command(*args)
    if check is not None:
        assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    return done


def _data_start(path) -> int:
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
    return 8 + length


def _flip_byte(path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def model_file(tmp_path):
    model = eqx.nn.MLP(3, 2, width_size=8, depth=1, activation=jax.nn.gelu, key=jax.random.key(0))
    path = tmp_path / "model.jxs"
    jaxstow.save(path, model, metadata={"epoch": 3, "note": "first run"})
    return path


def test_inspect_shows_the_tree_totals_and_metadata(model_file):
    out = jaxstow_command("inspect", model_file, check=0).stdout
    assert out.startswith(f"{model_file}: jaxstow (format 4), ")
    assert "structure: equinox.nn.MLP" in out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("path"))
    assert header.split() == ["path", "dtype", "shape", "size", "value"]
    assert any(line.split()[:4] == ["layers/0/weight", "float32", "(8,", "3)"] for line in lines)
    assert any(line.split() == ["activation", "ref", "jax.nn.gelu"] for line in lines)
    assert "6 leaves: 4 arrays (200 B), 2 values" in out  # (8*3 + 8 + 2*8 + 2) float32
    assert 'metadata: {"epoch": 3, "note": "first run"}' in out


def test_inspect_json_is_for_scripts(model_file):
    report = json.loads(jaxstow_command("inspect", "--json", model_file, check=0).stdout)
    assert report["format"] == "jaxstow" and report["version"] == 4 and report["metadata"]["epoch"] == 3
    assert report["file_bytes"] == os.path.getsize(model_file) and report["array_bytes"] == 200
    weight = next(leaf for leaf in report["leaves"] if leaf["path"] == "layers/0/weight")
    assert weight == {**weight, "kind": "array", "dtype": "float32", "shape": [8, 3], "nbytes": 96}
    assert len(weight["xxh3"]) == 16


def test_inspect_reads_plain_files_and_file_urls(tmp_path):
    from safetensors.numpy import save_file

    save_file({"emb": np.zeros((4, 2), np.float16)}, str(tmp_path / "plain.safetensors"))
    out = jaxstow_command("inspect", f"file://{tmp_path}/plain.safetensors", check=0).stdout
    assert ": plain safetensors, " in out and "emb   float16  (4, 2)  16 B" in out and "metadata" not in out
    np.savez(tmp_path / "plain.npz", a=np.arange(3))
    assert "a     int64  (3,)   24 B" in jaxstow_command("inspect", tmp_path / "plain.npz", check=0).stdout


def test_inspect_reads_fsspec_urls(capsys):
    fsspec = pytest.importorskip("fsspec")
    with fsspec.open("memory://cli-test/remote.jxs", "wb") as file:
        jaxstow.save(file, {"w": jnp.ones(3)}, metadata={"where": "memory"})
    assert main(["inspect", "memory://cli-test/remote.jxs"]) == 0
    out = capsys.readouterr().out
    assert "w     float32  (3,)   12 B" in out and 'metadata: {"where": "memory"}' in out


def test_inspect_refuses_a_folder_and_a_missing_file_clearly(tmp_path):
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"w": jnp.ones(2)})
    done = jaxstow_command("inspect", tmp_path / "run", check=2)
    assert f"{tmp_path / 'run'}: is a folder, not a file" in done.stderr and "jaxstow ls" in done.stderr
    done = jaxstow_command("inspect", tmp_path / "nothing.jxs", check=2)
    assert f"{tmp_path / 'nothing.jxs'}: no such file" in done.stderr


def test_verify_a_file_and_name_the_corrupt_leaf(tmp_path):
    path = tmp_path / "w.jxs"
    jaxstow.save(path, {"big": np.arange(1000, dtype=np.float32), "small": np.ones(4, np.int8)})
    out = jaxstow_command("verify", path, check=0).stdout
    assert f"ok       {path}: 2 checksums, 4.00 kB read" in out and "1 file intact" in out
    _flip_byte(path, _data_start(path) + 100)  # inside 'big', the first (largest item size) tensor
    done = jaxstow_command("verify", path, check=1)
    assert f"DAMAGED  leaf 'big' of {path}: checksum mismatch" in done.stdout
    assert "'small'" not in done.stdout and "1 of 1 file damaged" in done.stdout
    report = json.loads(jaxstow_command("verify", "--json", path, check=1).stdout)
    assert report["intact"] is False and report["files"][0]["damage"][0]["leaf"] == "big"


def test_verify_a_damaged_header(tmp_path):
    path = tmp_path / "w.jxs"
    jaxstow.save(path, {"w": np.ones(4, np.float32)})
    _flip_byte(path, 20)
    done = jaxstow_command("verify", path, check=1)
    assert f"DAMAGED  {path}: " in done.stdout and "header" in done.stdout


def test_verify_every_step_of_a_checkpoint_folder(tmp_path):
    run = tmp_path / "run"
    with CheckpointManager(run) as manager:
        for step in range(3):
            manager.save(step, {"params": {"w": jnp.full(256, step, jnp.float32)}, "opt": {"mu": jnp.zeros(8)}})
    out = jaxstow_command("verify", run, check=0).stdout
    assert out.count("ok ") == 6 and "6 files intact" in out
    damaged = run / "1" / "params.safetensors"
    _flip_byte(damaged, _data_start(damaged) + 7)
    done = jaxstow_command("verify", run, "--progress", check=1)
    assert f"DAMAGED  leaf 'w' of {damaged}: checksum mismatch" in done.stdout
    assert "1 of 6 files damaged" in done.stdout
    assert f"verifying {run}/0/opt.safetensors" in done.stderr  # the progress bar, on stderr


def test_diff_names_every_kind_of_difference(tmp_path):
    a, b, same = tmp_path / "a.jxs", tmp_path / "b.jxs", tmp_path / "same.jxs"
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32), "lr": 0.1, "old": 1}
    jaxstow.save(a, tree)
    jaxstow.save(same, tree)
    changed = {**tree, "w": tree["w"] + np.array([0, 0, 0.25, 0, 0, -2], np.float32).reshape(2, 3), "lr": 0.2}
    changed["b"] = np.zeros(4, np.float32)
    del changed["old"]
    changed["new"] = np.ones(2, ml_dtypes.bfloat16)
    jaxstow.save(b, changed)
    out = jaxstow_command("diff", a, b, check=1).stdout.splitlines()
    assert out[1:6] == [
        "b     shape (3,) -> (4,)",
        "lr    value 0.1 -> 0.2",
        "new   only in B",
        "old   only in A",
        "w     values differ: 2 of 6 elements, max |A - B| = 2",
    ]
    assert out[-1] == "5 of 5 leaves differ"
    assert jaxstow_command("diff", a, same, check=0).stdout == "the same: 4 leaves\n"
    report = json.loads(jaxstow_command("diff", "--json", a, b, check=1).stdout)
    assert {item["kind"] for item in report["differences"]} == {"shape", "value", "only in A", "only in B", "values"}


def test_ls_shows_steps_metrics_and_the_rule_that_keeps_each(tmp_path):
    run = tmp_path / "run"
    with CheckpointManager(run, keep=KeepPolicy(keep_last=2, keep_every=10, keep_best=1, metric="loss")) as manager:
        for step, loss in [(5, 0.9), (10, 0.8), (15, 0.1), (20, 0.5), (25, 0.6), (30, 0.7)]:
            manager.save(step, {"params": {"w": jnp.ones(100)}}, metrics={"loss": loss, "acc": 1 - loss})
    out = jaxstow_command("ls", run, check=0).stdout.splitlines()
    assert out[0].split() == ["step", "time", "size", "metrics", "kept", "by"]
    rows = {int(line.split()[0]): line for line in out[1:-1]}
    assert sorted(rows) == [10, 15, 20, 25, 30]
    assert rows[10].endswith("every 10") and rows[15].endswith("best 1 by loss")
    assert rows[20].endswith("every 10") and rows[25].endswith("last 2")
    assert rows[30].endswith("last 2, every 10") and "loss=0.7 acc=0.3" in rows[30]
    assert out[-1].startswith("5 steps, ") and out[-1].endswith("keep_last=2, keep_every=10, keep_best=1 by loss (min)")
    listing = json.loads(jaxstow_command("ls", "--json", run, check=0).stdout)
    assert [step["step"] for step in listing["steps"]] == [10, 15, 20, 25, 30]
    assert listing["steps"][0]["bytes"] == os.path.getsize(run / "10" / "params.safetensors")
    assert listing["keep_policy"]["keep_last"] == 2


def test_convert_npz_safetensors_and_a_torch_state_dict_to_jaxstow(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import save_file

    np.savez(tmp_path / "a.npz", w=np.arange(4.0), b=np.ones(2, np.int32))
    done = jaxstow_command("convert", tmp_path / "a.npz", tmp_path / "a.jxs", "--progress", check=0)
    assert f"saving {tmp_path / 'a.jxs'}" in done.stderr  # the progress bar
    restored = jaxstow.load(tmp_path / "a.jxs", as_numpy=True)
    np.testing.assert_array_equal(restored["w"], np.arange(4.0))
    assert restored["b"].dtype == np.int32

    save_file({"emb": np.full((2, 2), 3, np.float16)}, str(tmp_path / "s.safetensors"))
    out = jaxstow_command("convert", tmp_path / "s.safetensors", tmp_path / "s.jxs", check=0).stdout
    assert "(plain safetensors) -> " in out and "(jaxstow): 1 leaf" in out
    assert jaxstow.load(tmp_path / "s.jxs", as_numpy=True)["emb"].dtype == np.float16

    layer = torch.nn.Linear(3, 2)
    layer.to(torch.bfloat16)
    torch.save(layer.state_dict(), tmp_path / "linear.pt")
    out = jaxstow_command("convert", tmp_path / "linear.pt", tmp_path / "linear.jxs", check=0).stdout
    assert "(PyTorch zip) -> " in out and ": 2 leaves" in out
    weights = jaxstow.load(tmp_path / "linear.jxs", as_numpy=True)
    assert weights["weight"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(weights["weight"].astype(np.float32), layer.weight.float().detach().numpy())


class _Payload:
    """An object whose unpickling would run code: creating a marker folder."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_convert_never_unpickles_objects_from_a_torch_file(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "code-ran"
    torch.save({"w": torch.ones(2), "evil": _Payload(str(marker))}, tmp_path / "evil.pt")
    done = jaxstow_command("convert", tmp_path / "evil.pt", tmp_path / "evil.jxs", check=2)
    assert "not a PyTorch file of tensors that loads without unpickling objects" in done.stderr
    assert not marker.exists() and not (tmp_path / "evil.jxs").exists()


def test_convert_an_orbax_checkpoint(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    tree = {"params": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.zeros(3, jnp.bfloat16)}, "step": 7}
    ocp.PyTreeCheckpointer().save(tmp_path / "orbax", tree)
    out = jaxstow_command("convert", tmp_path / "orbax", tmp_path / "from_orbax.jxs", check=0).stdout
    assert "(orbax checkpoint) -> " in out and ": 3 leaves" in out
    restored = jaxstow.load(tmp_path / "from_orbax.jxs", as_numpy=True)
    np.testing.assert_array_equal(restored["params"]["w"], np.arange(6.0, dtype=np.float32).reshape(2, 3))
    assert restored["params"]["b"].dtype == ml_dtypes.bfloat16 and int(restored["step"]) == 7


@pytest.mark.skipif(not hasattr(ml_dtypes, "float8_e8m0fnu"), reason="needs ml_dtypes >= 0.5 (float8_e8m0fnu)")
def test_convert_to_plain_safetensors_gives_float8_e8m0_and_fnuz_their_codes(tmp_path):
    # They were written as raw bytes (U8) with a jaxstow manifest: other tools read bytes, not the arrays.
    torch = pytest.importorskip("torch")  # safetensors' numpy reader has none of these dtypes
    from safetensors import safe_open

    names = ("float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz")
    tree = {name: np.array([0.5, 2.0, 4.0], getattr(ml_dtypes, name)) for name in names}
    jaxstow.save(tmp_path / "f8.jxs", tree)
    done = jaxstow_command("convert", tmp_path / "f8.jxs", tmp_path / "f8.safetensors", check=0)
    assert "raw bytes" not in done.stderr
    with safe_open(str(tmp_path / "f8.safetensors"), framework="pt") as file:
        assert file.metadata() is None  # a plain file: no jaxstow manifest
        for name in names:
            tensor = file.get_tensor(name)
            assert tensor.dtype == getattr(torch, name), name
            assert tensor.to(torch.float32).tolist() == [0.5, 2.0, 4.0], name
    for name, array in jaxstow.load(tmp_path / "f8.safetensors", as_numpy=True).items():
        assert array.dtype == tree[name].dtype and array.tobytes() == tree[name].tobytes(), name


def test_convert_jaxstow_to_plain_safetensors_and_npz(tmp_path, model_file):
    from safetensors.numpy import load_file

    done = jaxstow_command("convert", model_file, tmp_path / "plain.safetensors", check=0)
    assert "have no place in a safetensors file" in done.stderr and "'activation'" in done.stderr
    plain = load_file(str(tmp_path / "plain.safetensors"))
    model = jaxstow.load(model_file, as_numpy=True)
    np.testing.assert_array_equal(plain["layers/0/weight"], model.layers[0].weight)
    jaxstow_command("convert", model_file, tmp_path / "plain.npz", check=0)
    with np.load(tmp_path / "plain.npz", allow_pickle=False) as archive:
        np.testing.assert_array_equal(archive["layers/1/bias"], model.layers[1].bias)
        assert "__jaxstow__" not in archive.files

    jaxstow.save(tmp_path / "bf16.jxs", {"x": jnp.ones(2, jnp.bfloat16)})
    done = jaxstow_command("convert", tmp_path / "bf16.jxs", tmp_path / "bf16.npz", check=0)  # as save writes it
    assert (
        "note: 1 leaves of a dtype the npz format has no code for here ('x' (bfloat16)) are kept as raw" in done.stderr
    )
    with np.load(tmp_path / "bf16.npz", allow_pickle=False) as archive:
        assert archive["x"].dtype == np.uint8 and "__jaxstow__" in archive.files
    assert jaxstow.load(tmp_path / "bf16.npz", as_numpy=True)["x"].dtype == ml_dtypes.bfloat16

    jaxstow.save(tmp_path / "key.jxs", {"key": jax.random.key(3)})
    done = jaxstow_command("convert", tmp_path / "key.jxs", tmp_path / "key.npz", check=0)
    assert "note: 1 PRNG keys ('key') are kept as their raw data, plain integers in a npz file" in done.stderr
    assert jaxstow.load(tmp_path / "key.npz", as_numpy=True)["key"].dtype == np.uint32  # as the note says


def test_convert_points_from_a_checkpoint_folder_to_its_files(tmp_path):
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(4, {"params": {"w": jnp.ones(2)}})
    done = jaxstow_command("convert", tmp_path / "run", tmp_path / "out.jxs", check=2)
    message = f"{tmp_path / 'run'}: is a jaxstow checkpoint folder: convert one of its item files instead, such as "
    assert message + f"{tmp_path}/run/4/params.safetensors" in done.stderr
    (tmp_path / "empty").mkdir()
    for command in ("ls", "verify"):
        done = jaxstow_command(command, tmp_path / "empty", check=2)
        assert f"{tmp_path / 'empty'}: holds no committed checkpoint step" in done.stderr


def test_convert_jaxstow_between_containers_keeps_the_whole_tree(tmp_path, model_file):
    jaxstow_command("convert", model_file, tmp_path / "model.npz", "--to", "jaxstow", check=0)
    model, again = jaxstow.load(model_file), jaxstow.load(tmp_path / "model.npz")
    assert again.activation is jax.nn.gelu and again.width_size == 8
    np.testing.assert_array_equal(again.layers[0].weight, model.layers[0].weight)
    assert jaxstow.load_metadata(tmp_path / "model.npz") == {"epoch": 3, "note": "first run"}


def test_help_of_every_command(capsys):
    out = jaxstow_command("--help", check=0).stdout
    for command in ("inspect", "verify", "diff", "ls", "convert"):
        assert command in out
        with pytest.raises(SystemExit) as exited:  # the same parser, in this process: one interpreter start is enough
            main([command, "--help"])
        assert exited.value.code == 0 and f"usage: jaxstow {command}" in capsys.readouterr().out


def _in_a_terminal(*arguments: str) -> str:
    """What ``jaxstow ARGUMENTS`` prints to a terminal (a pseudo-terminal of 120 columns)."""
    controller, terminal = pty.openpty()
    try:
        subprocess.run(
            [sys.executable, "-m", "jaxstow", *arguments],
            stdout=terminal,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
            timeout=300,
            check=True,
        )
        os.close(terminal)
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal is closed once everything is read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(controller)
    return drawn.decode()


def test_tables_are_drawn_by_rich_in_a_terminal(model_file):
    pytest.importorskip("rich")
    text = _in_a_terminal("inspect", str(model_file))
    assert "┃" in text or "│" in text  # rich's box drawing
    assert "layers/0/weight" in text


def test_names_from_a_file_cannot_drive_the_terminal_nor_fake_a_row(tmp_path):
    # A tensor name holding an escape sequence and a line break was printed raw: the terminal obeyed it, and the
    # table gained a row the file does not hold; in a terminal, rich read "[bold]" as its markup.
    from safetensors.numpy import save_file

    name = "evil\x1b[31m[bold]red\nfake.row  float32  (9,)  36 B"
    save_file({name: np.ones(2, np.float32)}, str(tmp_path / "odd.safetensors"))
    plain = jaxstow_command("inspect", tmp_path / "odd.safetensors", check=0).stdout
    assert "\x1b" not in plain and not any(line.startswith("fake.row") for line in plain.splitlines())
    assert "evil\\x1b[31m[bold]red\\nfake.row" in plain
    pytest.importorskip("rich")
    drawn = _in_a_terminal("inspect", str(tmp_path / "odd.safetensors"))
    assert "[bold]" in drawn and "\\x1b[31m" in drawn and "\x1b[31m" not in drawn


def test_a_folder_in_place_of_an_item_file_is_damage_to_its_step_and_the_others_are_checked(tmp_path):
    # verify and ls stopped at that step with status 2: a later step's damage was never reported.
    with CheckpointManager(tmp_path / "run") as manager:
        for step in (1, 2, 3):
            manager.save(step, {"w": jnp.full(2, step, jnp.float32)})
    (tmp_path / "run" / "2" / "w.safetensors").unlink()
    (tmp_path / "run" / "2" / "w.safetensors").mkdir()
    damaged = tmp_path / "run" / "3" / "w.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 1
    damaged.write_bytes(bytes(data))
    verified = jaxstow_command("verify", tmp_path / "run", check=1).stdout
    assert "2/w.safetensors: is a folder, not a file" in verified and "3/w.safetensors: checksum mismatch" in verified
    listed = jaxstow_command("ls", tmp_path / "run", check=1).stdout
    assert "DAMAGED  step 2: " in listed and "3 steps (1 damaged)" in listed


def test_a_metric_name_in_a_step_record_cannot_drive_the_terminal(tmp_path):
    # ls printed the keep rules (a metric named in the record) raw.
    metric = "loss\x1b[2J\nforged line"
    with CheckpointManager(tmp_path / "run", keep=KeepPolicy(keep_best=1, metric=metric)) as manager:
        manager.save(1, {"w": jnp.ones(2)}, metrics={metric: 0.5})
    listed = jaxstow_command("ls", tmp_path / "run", check=0).stdout
    assert "\x1b" not in listed and "loss\\x1b[2J\\nforged line" in listed
    assert not any(line.startswith("forged line") for line in listed.splitlines())


def test_ls_and_verify_a_folder_on_s3(s3_server):
    url = s3_server.url("cli-run")
    with CheckpointManager(url, keep=KeepPolicy(keep_last=2), storage_options=s3_server.storage_options) as manager:
        for step in range(3):
            manager.save(step, {"w": jnp.full(64, step, jnp.float32)}, metrics={"loss": 1.0 / (step + 1)})
    env = {**os.environ, "FSSPEC_S3": json.dumps(s3_server.storage_options)}  # fsspec's own configuration

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return forked_cli.jaxstow_command(*args, env=env)

    listed = command("ls", url)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:-1]] == ["1", "2"]
    verified = command("verify", url)
    assert verified.returncode == 0, verified.stderr
    assert f"ok       {url}/2/w.safetensors: 1 checksum, 256 B read" in verified.stdout
    inspected = command("inspect", f"{url}/2/w.safetensors")
    assert "(root)  float32  (64,)  256 B" in inspected.stdout, inspected.stderr
    assert "loss" not in inspected.stdout  # metrics live in the step record, not in the file


def hf_folder(folder) -> dict[str, np.ndarray]:
    """A Hugging Face folder as the hub holds one: two shards of safetensors files and their index."""
    from safetensors.numpy import save_file

    tensors = {
        "model.embed.weight": np.ones((16, 8), np.float32),
        "model.proj.weight": np.zeros((8, 8), ml_dtypes.bfloat16),
        "model.proj.bias": np.zeros(8, np.float32),
    }
    shards = {"model-00001-of-00002.safetensors": ["model.embed.weight"]}
    shards["model-00002-of-00002.safetensors"] = ["model.proj.weight", "model.proj.bias"]
    folder.mkdir()
    for file, names in shards.items():
        save_file({name: tensors[name] for name in names}, str(folder / file), metadata={"format": "pt"})
    weight_map = {name: file for file, names in shards.items() for name in names}
    index = {"metadata": {"total_size": sum(array.nbytes for array in tensors.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return tensors


def test_inspect_a_hugging_face_folder_lists_each_tensor_with_its_shard(tmp_path):
    hf_folder(tmp_path / "hf")
    out = jaxstow_command("inspect", tmp_path / "hf", check=0).stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'hf'}: Hugging Face safetensors folder, 2 shards, index model.safetensors")
    assert lines[1].split() == ["path", "shard", "dtype", "shape", "size"]
    assert lines[2].split() == ["model.embed.weight", "model-00001-of-00002.safetensors", "float32", "(16,", "8)", "512", "B"]  # fmt: skip
    assert lines[4].split()[:4] == ["model.proj.weight", "model-00002-of-00002.safetensors", "bfloat16", "(8,"]
    assert "3 tensors (672 B) in 2 shards" in out and 'metadata: {"total_size": 672}' in out
    report = json.loads(jaxstow_command("inspect", "--json", tmp_path / "hf", check=0).stdout)
    assert report["index"] == "model.safetensors.index.json" and len(report["shards"]) == 2
    bias = next(leaf for leaf in report["leaves"] if leaf["path"] == "model.proj.bias")
    assert bias == {**bias, "shard": "model-00002-of-00002.safetensors", "dtype": "float32", "shape": [8], "nbytes": 32}


def test_verify_a_hugging_face_folder_checks_its_structure_and_says_no_checksums(tmp_path):
    folder = tmp_path / "hf"
    hf_folder(folder)
    out = jaxstow_command("verify", folder, check=0).stdout
    assert f"ok       {folder}/model-00001-of-00002.safetensors: header and sizes, 1 tensor (512 B)" in out
    assert f"ok       {folder}/model-00002-of-00002.safetensors: header and sizes, 2 tensors (160 B)" in out
    assert f"ok       {folder}/model.safetensors.index.json: 3 tensors, each in the shard it names" in out
    assert "3 files intact (structure only: safetensors files carry no checksums" in out
    report = json.loads(jaxstow_command("verify", "--json", folder, check=0).stdout)
    assert report["intact"] and "carry no checksums" in report["checked"] and len(report["files"]) == 3


def test_verify_names_a_tensor_that_a_shard_holds_and_the_index_leaves_out(tmp_path):
    folder = tmp_path / "hf"
    hf_folder(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.proj.bias"]  # every load leaves it out, as transformers does
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    done = jaxstow_command("verify", folder, check=1)
    assert (
        f"DAMAGED  {folder}/model-00002-of-00002.safetensors: holds 'model.proj.bias', which "
        "model.safetensors.index.json does not map: every load leaves it out"
    ) in done.stdout


def test_ls_says_what_a_hugging_face_folder_is(tmp_path):
    folder = tmp_path / "hf"
    hf_folder(folder)
    out = jaxstow_command("ls", folder, check=0).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["shard", "tensors", "size"]
    assert lines[1].split()[:2] == ["model-00001-of-00002.safetensors", "1"]
    assert lines[2].split()[:2] == ["model-00002-of-00002.safetensors", "2"]
    assert lines[-1].startswith(f"{folder}: a Hugging Face safetensors folder of 2 shards, 3 tensors, ")
    assert lines[-1].endswith("; index model.safetensors.index.json")
    report = json.loads(jaxstow_command("ls", "--json", folder, check=0).stdout)
    assert [shard["tensors"] for shard in report["shards"]] == [1, 2]
    assert [shard["bytes"] for shard in report["shards"]] == [
        os.path.getsize(folder / s["file"]) for s in report["shards"]
    ]


def test_verify_a_damaged_hugging_face_folder_names_each_problem(tmp_path):
    folder = tmp_path / "hf"
    hf_folder(folder)
    cut = folder / "model-00002-of-00002.safetensors"
    cut.write_bytes(cut.read_bytes()[:-10])  # a shard cut short, as an interrupted download leaves it
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors"  # a tensor its shard lacks
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    done = jaxstow_command("verify", folder, check=1)
    assert f"ok       {folder}/model-00001-of-00002.safetensors" in done.stdout
    assert f"' of {cut}: the data ends at byte" in done.stdout  # the last tensor of the shard, named
    assert (
        f"DAMAGED  leaf 'lm_head.weight' of {folder}/model.safetensors.index.json: maps it to "
        "model-00001-of-00002.safetensors, which holds no tensor of this name"
    ) in done.stdout  # the index's line: what it maps is not there
    assert "2 of 3 files damaged" in done.stdout and done.stderr == ""
    assert done.stdout.count("DAMAGED") == 2
    cut.unlink()
    done = jaxstow_command("verify", folder, check=1)
    assert f"DAMAGED  {cut}: is missing: model.safetensors.index.json maps 2 tensors to it" in done.stdout


def test_inspect_verify_and_ls_a_hugging_face_folder_on_s3(s3_server, tmp_path):
    import fsspec

    hf_folder(tmp_path / "hf")
    url = s3_server.url("cli-hf")
    fs, root = fsspec.core.url_to_fs(url, **s3_server.storage_options)
    for path in (tmp_path / "hf").iterdir():
        fs.put_file(str(path), f"{root}/{path.name}")
    options = json.dumps(s3_server.storage_options)
    inspected = jaxstow_command("inspect", url, "--storage-options", options, check=0).stdout
    assert "model.proj.weight   model-00002-of-00002.safetensors  bfloat16  (8, 8)" in inspected
    verified = jaxstow_command("verify", url, "--storage-options", options, check=0).stdout
    assert f"ok       {url}/model.safetensors.index.json: 3 tensors, each in the shard it names" in verified
    listed = jaxstow_command("ls", url, "--storage-options", options, check=0).stdout
    assert f"{url}: a Hugging Face safetensors folder of 2 shards, 3 tensors" in listed
