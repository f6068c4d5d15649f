"""The ``jaxstow`` command on a user's mistakes: one line on stderr and exit status 2, never a traceback; status 1
only for damage or differences; a closed pipe ends quietly. Each command runs in a process of its own
(tests/support/forked_cli.py); the closed pipe is met by ``python -m jaxstow`` itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import forked
import forked_cli
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow import CheckpointManager
from jaxstow._format.manifest import FORMAT_VERSION
from jaxstow.errors import PathNotFoundError
from reliability.forge import forge_native, split_native

#: No credentials from this machine's files or its cloud metadata service: only what a test gives.
_NO_CLOUD = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_MAX_ATTEMPTS": "1",
}


def jaxstow_command(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "FSSPEC_"))}
    return forked_cli.jaxstow_command(*args, env={**clean, **_NO_CLOUD, **(env or {})})


def assert_one_line_error(done: subprocess.CompletedProcess[str], command: str, *expected: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"jaxstow {command}: "), done.stderr
    for text in expected:
        assert text in lines[0], (text, lines[0])
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.fixture
def files(tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"w": np.arange(6, dtype=np.float32), "step": 3})
    (tmp_path / "random.bin").write_bytes(np.random.default_rng(0).bytes(100))  # fixed: byte 8 is not "{"
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"w": jnp.ones(2)})
    return tmp_path


@pytest.mark.parametrize(
    ("command", "names", "expected"),
    [
        ("inspect", ["nothing.jxs"], "nothing.jxs: no such file"),
        ("inspect", ["run"], "run: is a folder, not a file"),
        ("inspect", ["random.bin"], "random.bin: not a jaxstow, safetensors or npz file"),
        ("verify", ["nothing.jxs"], "nothing.jxs: no such file"),
        ("verify", ["random.bin"], "random.bin: not a jaxstow, safetensors or npz file"),
        ("diff", ["model.jxs", "nothing.jxs"], "nothing.jxs: no such file"),
        ("ls", ["nothing"], "nothing: no such folder"),
        ("ls", ["model.jxs"], "model.jxs: is a file, not a checkpoint folder"),
        ("ls", ["empty"], "empty: holds no committed checkpoint step"),
    ],
)
def test_a_mistake_is_one_line_and_status_2(files, command, names, expected):
    (files / "empty").mkdir()
    assert_one_line_error(jaxstow_command(command, *(files / name for name in names)), command, f"{files}/{expected}")


def test_uploads_of_a_url_without_a_bucket_asks_for_one():
    assert_one_line_error(jaxstow_command("uploads", "s3://"), "uploads", "s3://: names no bucket: give s3://BUCKET")


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_a_folder_of_files_is_no_checkpoint_folder_and_its_files_are_named(tmp_path, command):
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("a.jxs", "b.jxs"):
        jaxstow.save(folder / name, {"w": np.ones(2, np.float32)})
    done = jaxstow_command(command, folder)
    assert_one_line_error(
        done, command, f"{folder}: holds no committed checkpoint step", "the files a.jxs, b.jxs", f"{folder}/a.jxs"
    )
    assert "loads as one model" not in done.stderr


@pytest.mark.parametrize("command", ["convert", "inspect", "verify", "ls"])
def test_a_folder_of_a_hub_model_without_safetensors_files_names_its_torch_file_and_the_call(tmp_path, command):
    torch = pytest.importorskip("torch")
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text("{}")
    torch.save({"wte.weight": torch.ones(4, 2)}, model / "pytorch_model.bin")
    torch.save({"step": torch.tensor(3)}, model / "optimizer.pt")  # sorted first, but not the model's weights
    done = jaxstow_command(command, model, *([tmp_path / "gpt2.jxs"] if command == "convert" else []))
    assert_one_line_error(
        done,
        command,
        f"{model}: is a folder of no model jaxstow reads whole: it holds pytorch_model.bin, a PyTorch zip file "
        f"(torch.save): jaxstow.load('{model}/pytorch_model.bin', from_format='torch') reads its tensors",
    )
    with pytest.raises(jaxstow.errors.IsAFolderError, match=r"it holds pytorch_model\.bin, a PyTorch zip file"):
        jaxstow.load(model)


def test_a_folder_of_a_sharded_torch_model_says_the_file_it_names_is_one_shard_of_several(tmp_path):
    torch = pytest.importorskip("torch")
    model = tmp_path / "big"
    model.mkdir()
    for number in (1, 2):
        torch.save({f"layer{number}": torch.ones(2)}, model / f"pytorch_model-0000{number}-of-00002.bin")
    with pytest.raises(jaxstow.errors.IsAFolderError) as info:
        jaxstow.load(model)
    assert "it holds pytorch_model-00001-of-00002.bin (one of 2 shards of a model, each read the same way), a " in str(
        info.value
    )


def test_converting_a_torch_file_onto_itself_is_refused_and_leaves_it_as_it_was(tmp_path):
    torch = pytest.importorskip("torch")
    source = tmp_path / "model.pt"
    torch.save({"w": torch.ones(3)}, source)
    before = source.read_bytes()
    (tmp_path / "link.pt").symlink_to(source)
    for destination in (source, tmp_path / "link.pt"):
        assert_one_line_error(
            jaxstow_command("convert", source, destination),
            "convert",
            f"{destination}: is SRC itself, a PyTorch zip file (torch.save): the jaxstow file written there would "
            f"replace it, and jaxstow writes no such file back; give another DST, such as {tmp_path / 'model'}.jxs",
        )
    assert source.read_bytes() == before


def test_a_newer_format_is_an_error_not_damage(tmp_path):
    tensors, manifest, data = split_native(jaxstow_bytes({"w": np.ones(3, np.float32)}))
    assert manifest is not None
    newer = tmp_path / "newer.jxs"
    version = FORMAT_VERSION + 1
    newer.write_bytes(
        forge_native(tensors, manifest.replace(f'"version":{FORMAT_VERSION}', f'"version":{version}'), data)
    )
    message = f"{newer}: cannot read: format {version} is newer than this jaxstow ({FORMAT_VERSION}); upgrade jaxstow"
    for command in ("verify", "inspect"):
        assert_one_line_error(jaxstow_command(command, newer), command, message)
    with pytest.raises(jaxstow.errors.NewerFormatError, match=f"format {version} is newer than this jaxstow"):
        jaxstow.load(newer)


def jaxstow_bytes(tree) -> bytes:
    import io

    buffer = io.BytesIO()
    jaxstow.save(buffer, tree)
    return buffer.getvalue()


def test_a_closed_pipe_ends_quietly(tmp_path):
    path = tmp_path / "wide.jxs"
    jaxstow.save(path, {f"leaf{i:04d}": np.zeros(2, np.float32) for i in range(3000)})  # a table of ~150 kB
    reader = forked.Popen(
        [sys.executable, "-m", "jaxstow", "inspect", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stderr is not None
    first = reader.stdout.readline()  # as `| head -1` does: read a line, then close the pipe
    reader.stdout.close()
    errors = reader.stderr.read()
    assert reader.wait(timeout=300) == 141
    assert first.startswith(str(path).encode()) and errors == b""


def test_no_checksums_only_for_files_that_have_none(tmp_path):
    from safetensors.numpy import save_file

    values = tmp_path / "step.jxs"
    jaxstow.save(values, {"step": 7, "lr": 0.5})  # what a manager writes for a step counter: values only
    out = jaxstow_command("verify", values)
    assert out.returncode == 0 and f"ok       {values}: 0 checksums, 0 B read (no arrays; its header's" in out.stdout
    plain = tmp_path / "plain.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(plain))
    out = jaxstow_command("verify", plain)
    assert out.returncode == 0 and "(no checksums: not written by jaxstow)" in out.stdout


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_server_is_one_line(files):
    pytest.importorskip("s3fs")
    endpoint = json.dumps({"endpoint_url": f"http://127.0.0.1:{_closed_port()}", "key": "k", "secret": "s"})
    for command in ("inspect", "ls", "verify"):
        done = jaxstow_command(command, "s3://bucket/model.jxs", env={"FSSPEC_S3": endpoint})
        assert_one_line_error(done, command, "s3://bucket/model.jxs: ")


def test_missing_credentials_are_one_line(s3_server):
    url = s3_server.url("no-credentials", "model.jxs")
    fsspec = pytest.importorskip("fsspec")
    with fsspec.open(url, "wb", **s3_server.storage_options) as file:  # written with credentials
        jaxstow.save(file, {"w": np.ones(2)})
    endpoint = json.dumps({"client_kwargs": {"endpoint_url": s3_server.endpoint}})
    done = jaxstow_command("inspect", url, env={"FSSPEC_S3": endpoint})
    assert_one_line_error(done, "inspect", url)
    assert "credentials" in done.stderr.lower()


@pytest.mark.parametrize("command", ["inspect", "ls", "verify", "uploads"])
def test_a_bucket_that_does_not_exist_is_named_in_one_line(s3_server, command):
    missing = f"s3://{s3_server.bucket}-typo/run/model.jxs"  # it said: no such file (or folder)
    configured = {"FSSPEC_S3": json.dumps(s3_server.storage_options)}
    done = jaxstow_command(command, missing, env=configured)
    assert_one_line_error(done, command, f"{missing}: no bucket '{s3_server.bucket}-typo': the storage has none")
    done = jaxstow_command(command, s3_server.url("no-such-key", "model.jxs"), env=configured)  # in a bucket there
    assert done.returncode == (0 if command == "uploads" else 2) and "no bucket" not in done.stderr, done.stderr


def test_a_load_from_a_bucket_that_does_not_exist_names_the_bucket(s3_server):
    missing = f"s3://{s3_server.bucket}-typo/model.jxs"
    with pytest.raises(PathNotFoundError, match=f"{missing}: no bucket '{s3_server.bucket}-typo'"):
        jaxstow.load(missing, storage_options=s3_server.storage_options)
    with pytest.raises(PathNotFoundError, match=r"model.jxs: no such file or folder$"):
        jaxstow.load(s3_server.url("no-such-key", "model.jxs"), storage_options=s3_server.storage_options)


@pytest.fixture
def hf_folders(tmp_path):
    """Hugging Face folders, exported by jaxstow: one with a shard cut short, one whose index names a tensor its shard
    lacks, and a folder holding a jaxstow file beside a stray safetensors file."""
    jaxstow.save(tmp_path / "model.jxs", {"embed": np.ones((16, 8), np.float32), "head": np.zeros((8, 4), np.float32)})
    for name in ("cut", "unindexed"):
        jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / name, max_shard_size="600B")
    shard = tmp_path / "cut" / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4])
    index_path = tmp_path / "unindexed" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    (tmp_path / "mixed").mkdir()
    jaxstow.save(tmp_path / "mixed" / "model.jxs", {"w": np.ones(2)})
    jaxstow.export_safetensors(tmp_path / "model.jxs", tmp_path / "export")
    (tmp_path / "export" / "model-00001-of-00001.safetensors").rename(tmp_path / "mixed" / "notes-export.safetensors")
    return tmp_path


@pytest.mark.parametrize(
    ("command", "folder", "expected"),
    [
        ("inspect", "cut", "cut/model-00002-of-00002.safetensors: the data ends at byte"),
        ("ls", "cut", "cut/model-00002-of-00002.safetensors: the data ends at byte"),
        (
            "inspect",
            "unindexed",
            "unindexed/model.safetensors.index.json: maps it to model-00001-of-00002.safetensors,",
        ),
        ("ls", "unindexed", "unindexed/model.safetensors.index.json: maps it to model-00001-of-00002.safetensors,"),
        ("inspect", "mixed", "mixed: holds model.jxs (a jaxstow file) beside notes-export.safetensors"),
        ("verify", "mixed", "mixed: holds model.jxs (a jaxstow file) beside notes-export.safetensors"),
        ("ls", "mixed", "mixed: holds model.jxs (a jaxstow file) beside notes-export.safetensors"),
    ],
)
def test_a_damaged_or_mixed_hugging_face_folder_is_one_line(hf_folders, command, folder, expected):
    done = jaxstow_command(command, hf_folders / folder)
    assert_one_line_error(done, command, f"{hf_folders}/{expected}")


def test_verify_reports_a_damaged_hugging_face_folder_as_damage(hf_folders):
    for folder in ("cut", "unindexed"):
        done = jaxstow_command("verify", hf_folders / folder)
        assert done.returncode == 1 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
        assert "DAMAGED  leaf '" in done.stdout and "1 of 3 files damaged" in done.stdout


def test_names_from_a_hugging_face_folder_reach_the_terminal_escaped(tmp_path):
    from safetensors.numpy import save_file

    shard = "model-00001-of-00001.safetensors"
    odd_index, odd_folder = tmp_path / "odd-index", tmp_path / "odd-names"
    for folder in (odd_index, odd_folder):
        folder.mkdir()
        save_file({"a": np.zeros(2, np.float32)}, folder / shard)
    (odd_index / "\x1b]0;pwned\x07\x1b[31mevil.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": shard}})
    )
    odd_map = {"a": shard, "\x1b[2J\x1b[31mred": "\x1b]0;t\x07x.safetensors"}
    (odd_folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": odd_map}))
    for command in ("inspect", "ls"):
        for folder in (odd_index, odd_folder):
            done = jaxstow_command(command, folder)
            assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr
            assert "\\x1b" in done.stdout + done.stderr


def test_a_link_that_leads_round_in_a_circle_is_told_as_such_not_as_missing(tmp_path):
    (tmp_path / "a.jxs").symlink_to(tmp_path / "b.jxs")
    (tmp_path / "b.jxs").symlink_to(tmp_path / "a.jxs")
    for command in ("inspect", "verify"):
        done = jaxstow_command(command, tmp_path / "a.jxs")
        assert_one_line_error(done, command, f"{tmp_path / 'a.jxs'}: cannot open it: too many levels of symbolic links")


def test_saving_under_a_file_as_if_it_were_a_folder_says_it_is_a_file(tmp_path):
    (tmp_path / "train.py").write_text("")
    with pytest.raises(jaxstow.errors.PathError, match=r"cannot write it: .*train\.py is a file, not a folder"):
        jaxstow.save(tmp_path / "train.py" / "model.jxs", {"w": np.ones(2)})


def _resigned(tmp_path, value: object) -> str:
    """A file whose value leaf holds ``value`` in a header signed again, every checksum of it right."""
    path = tmp_path / "model.jxs"
    jaxstow.save(path, {"n": 1, "w": np.ones(2, np.float32)})
    tensors, manifest, data = split_native(path.read_bytes())
    entries = json.loads(manifest)
    index = next(key for key, entry in entries["details"].items() if "value" in entry)
    entries["details"][index] = {"value": value}
    path.write_bytes(forge_native(tensors, json.dumps(entries), data))
    return str(path)


@pytest.mark.parametrize(
    ("value", "said"),
    [({"foo": 1}, "unreadable value {'foo': 1}"), ({"ref": "os.system"}, "jaxstow's name policy refuses")],
)
def test_verify_finds_what_a_load_would_refuse_though_every_checksum_holds(tmp_path, value, said):
    path = _resigned(tmp_path, value)
    with pytest.raises(jaxstow.errors.FormatError if "foo" in said else jaxstow.errors.RefusedNameError):
        jaxstow.load(path)
    done = jaxstow_command("verify", path)
    assert done.returncode == 1 and f"DAMAGED  leaf 'n' of {path}: " in done.stdout and said in done.stdout


def test_verify_leaves_a_name_of_a_library_not_imported_to_the_load(tmp_path):
    path = _resigned(tmp_path, {"ref": "my_project.activation"})
    done = jaxstow_command("verify", path)
    assert done.returncode == 0 and "1 file intact" in done.stdout


def test_verify_calls_a_plain_file_whose_shape_and_offsets_disagree_damaged(tmp_path):
    header = b'{"a":{"dtype":"F32","shape":[5],"data_offsets":[0,12]}}'
    path = tmp_path / "plain.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(12))
    done = jaxstow_command("verify", path)
    assert done.returncode == 1, done
    assert f"DAMAGED  leaf 'a' of {path}: shape [5] of float32 needs 20 bytes" in done.stdout


def test_verify_calls_a_plain_file_whose_header_is_no_json_damaged_as_a_folder_shard_of_it(tmp_path):
    """Was: an error (exit 2) alone, damage (exit 1) as a Hugging Face folder's shard."""
    header = b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}'
    alone, shard = tmp_path / "plain.safetensors", tmp_path / "hf" / "model.safetensors"
    shard.parent.mkdir()
    for path in (alone, shard):
        path.write_bytes(len(header).to_bytes(8, "little") + header.replace(b'"a"', b"'a'") + bytes(12))
        done = jaxstow_command("verify", path if path is alone else path.parent)
        assert done.returncode == 1, done
        assert f"DAMAGED  {path}: the header is not valid JSON" in done.stdout and "Traceback" not in done.stderr


def test_a_server_that_cannot_be_reached_is_named_so_not_as_a_missing_file():
    done = jaxstow_command("inspect", "http://127.0.0.1:1/model.jxs")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "the storage failed" in done.stderr and "no such file" not in done.stderr, done.stderr


def test_a_torch_file_cut_short_is_called_damaged_not_an_npz(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(64, 64)}, tmp_path / "model.pt")
    data = (tmp_path / "model.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    done = subprocess.run(
        [sys.executable, "-m", "jaxstow", "convert", str(tmp_path / "cut.pt"), str(tmp_path / "out.jxs")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done
    assert "not a readable zip archive, as an npz or a PyTorch file is" in done.stderr
    assert "the file is damaged or cut short" in done.stderr
