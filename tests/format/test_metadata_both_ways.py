"""Metadata both ways: a jaxstow file's string metadata is plain ``__metadata__`` that safetensors' own tools show, a
plain safetensors file's ``__metadata__`` is what jaxstow shows, and dtypes npz lacks follow one rule in ``save`` and
``convert``.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import forked
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import jaxstow
from jaxstow.cli import main
from jaxstow.errors import CorruptFileError, MetadataError
from reliability.forge import forge_native, split_native

METADATA = {"model": "mlp", "epoch": 3, "run": {"lr": 0.1, "name": "inner"}, "note": "é ✓"}


def jaxstow_command(*args: object) -> subprocess.CompletedProcess[str]:
    return forked.run([sys.executable, "-m", "jaxstow", *map(str, args)], capture_output=True, text=True, timeout=120)


def test_safetensors_shows_the_string_metadata_of_a_jaxstow_file(tmp_path):
    path = tmp_path / "model.jxs"
    jaxstow.save(path, {"w": jnp.arange(3.0), "depth": 2}, metadata=METADATA)
    with safe_open(str(path), "np") as file:  # safetensors' Rust parser reads the header
        shown = file.metadata()
    assert {key: shown[key] for key in shown if not key.startswith("jaxstow")} == {"model": "mlp", "note": "é ✓"}
    assert load_file(str(path))["w"].tolist() == [0.0, 1.0, 2.0]
    keys = list(json.loads(path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")])["__metadata__"])
    assert keys[0] == "jaxstow" and keys[-1] == "jaxstow_header_xxh3"  # the checksum stays last
    assert jaxstow.load_metadata(path) == METADATA  # the manifest's metadata, whole, is the source of truth
    with jaxstow.open(path) as reader:
        assert reader.metadata == METADATA


def test_jaxstow_shows_the_metadata_of_a_plain_safetensors_file(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"x": np.ones(2, np.float32)}, str(path), metadata={"foo": "bar", "format": "pt"})
    assert jaxstow.load_metadata(path) == {"foo": "bar", "format": "pt"}
    with jaxstow.open(path) as reader:
        assert reader.metadata == {"foo": "bar", "format": "pt"}
    report = json.loads(jaxstow_command("inspect", "--json", path).stdout)
    assert report["metadata"] == {"foo": "bar", "format": "pt"} and report["format"] == "plain safetensors"
    text = jaxstow_command("inspect", path).stdout
    line = next(line for line in text.splitlines() if line.startswith("metadata: "))
    assert json.loads(line.removeprefix("metadata: ")) == {"foo": "bar", "format": "pt"}  # in the file's order
    save_file({"x": np.ones(2, np.float32)}, str(tmp_path / "bare.safetensors"))
    assert jaxstow.load_metadata(tmp_path / "bare.safetensors") is None


@pytest.mark.parametrize("key", ["jaxstow", "jaxstow_header_xxh3", "jaxstow_version", "jaxstowish"])
@pytest.mark.parametrize("name", ["refused.jxs", "refused.npz"])
def test_a_key_that_collides_with_jaxstows_own_is_refused_before_writing(tmp_path, key, name):
    path = tmp_path / name
    with pytest.raises(MetadataError, match=f"key '{key}' starts with 'jaxstow', which the file's own keys use") as e:
        jaxstow.save(path, {"w": jnp.ones(2)}, metadata={key: "x", "epoch": 1})
    assert str(path) in str(e.value) and not path.exists()
    jaxstow.save(path, {"w": jnp.ones(2)}, metadata={"Jaxstow": "x", "my_jaxstow": "y"})  # only the prefix is kept
    assert jaxstow.load_metadata(path) == {"Jaxstow": "x", "my_jaxstow": "y"}


def test_plain_keys_that_differ_from_the_manifest_are_damage(tmp_path):
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"w": jnp.ones(2)}, metadata={"model": "mlp"})
    tensors, text, data = split_native(buffer.getvalue())
    assert text is not None
    assert jaxstow.load_metadata(io.BytesIO(forge_native(tensors, text, data, plain={"model": "mlp"}))) == {
        "model": "mlp"
    }
    for plain in ({"model": "cnn"}, {"model": "mlp", "extra": "1"}, {}):
        forged = forge_native(tensors, text, data, plain=plain)
        with pytest.raises(CorruptFileError, match="plain metadata keys differ from the manifest's"):
            jaxstow.load(io.BytesIO(forged))
    flipped = bytearray(buffer.getvalue())
    flipped[flipped.index(b'"model":"mlp"') + 10] ^= 0x01  # a flipped byte in a plain key's value
    with pytest.raises(CorruptFileError, match="checksum does not match"):
        jaxstow.load(io.BytesIO(bytes(flipped)))


def test_a_string_safetensors_cannot_parse_stays_in_the_manifest_only(tmp_path):
    path = tmp_path / "surrogate.jxs"
    odd = "\ud800"  # a lone surrogate: JSON escapes it, serde (safetensors' parser) refuses it
    jaxstow.save(path, {"w": jnp.ones(2)}, metadata={"odd": odd, "fine": "yes"})
    with safe_open(str(path), "np") as file:
        shown = file.metadata()
    assert shown["fine"] == "yes" and "odd" not in shown
    assert jaxstow.load_metadata(path) == {"odd": odd, "fine": "yes"}


# -- dtypes npz lacks: one rule ---------------------------------------------------------------------------------------

RAW_DTYPES = [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.int4]


@pytest.mark.parametrize("dtype", RAW_DTYPES, ids=lambda dtype: np.dtype(dtype).name)
def test_save_and_convert_keep_a_dtype_npz_lacks_as_raw_bytes_with_its_dtype(tmp_path, dtype):
    values = np.arange(-2, 4).astype(dtype).reshape(2, 3)
    tree = {"a": values, "plain": np.arange(3, dtype=np.int16)}
    jaxstow.save(tmp_path / "saved.npz", tree)
    jaxstow.save(tmp_path / "model.jxs", tree)
    assert main(["convert", str(tmp_path / "model.jxs"), str(tmp_path / "converted.npz")]) == 0
    for name in ("saved.npz", "converted.npz"):
        with np.load(tmp_path / name, allow_pickle=False) as archive:
            assert archive["a"].dtype == np.uint8 and archive["a"].tobytes() == values.tobytes()
            assert archive["plain"].dtype == np.int16 and "__jaxstow__" in archive.files
        restored = jaxstow.load(tmp_path / name, as_numpy=True)
        assert restored["a"].dtype == np.dtype(dtype) and restored["a"].tobytes() == values.tobytes()
        assert restored["a"].shape == (2, 3)
    assert main(["convert", str(tmp_path / "converted.npz"), str(tmp_path / "back.jxs")]) == 0
    back = jaxstow.load(tmp_path / "back.jxs", as_numpy=True)
    assert back["a"].dtype == np.dtype(dtype) and back["a"].tobytes() == values.tobytes()


def test_convert_between_containers_tells_the_new_one_the_dtypes_it_keeps_raw(tmp_path):
    key = jax.random.key(3)
    tree = {"bf16": jnp.ones((2, 2), jnp.bfloat16), "int4": np.arange(4).astype(ml_dtypes.int4), "key": key, "n": 1}
    jaxstow.save(tmp_path / "model.jxs", tree)
    assert main(["convert", str(tmp_path / "model.jxs"), str(tmp_path / "model.npz"), "--to", "jaxstow"]) == 0
    assert main(["convert", str(tmp_path / "model.npz"), str(tmp_path / "again.jxs")]) == 0
    for name in ("model.npz", "again.jxs"):
        restored = jaxstow.load(tmp_path / name, as_numpy=True)
        assert restored["bf16"].dtype == ml_dtypes.bfloat16 and restored["int4"].dtype == ml_dtypes.int4
        np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(key))
        assert restored["n"] == 1


def test_plain_npz_stays_plain_when_npz_holds_every_dtype(tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"w": np.ones(2, np.float32), "depth": 2})
    assert main(["convert", str(tmp_path / "model.jxs"), str(tmp_path / "plain.npz")]) == 0
    with np.load(tmp_path / "plain.npz", allow_pickle=False) as archive:
        assert archive.files == ["w"]
    with pytest.raises(jaxstow.errors.ArgumentError, match=r"only under a name ending in \.npz"):
        jaxstow.cli.convert.run(_args(tmp_path, "bf16.bin"))


def _args(tmp_path, dst: str):
    import argparse

    jaxstow.save(tmp_path / "bf16.jxs", {"x": np.ones(2, ml_dtypes.bfloat16)})
    return argparse.Namespace(
        src=str(tmp_path / "bf16.jxs"), dst=str(tmp_path / dst), to="npz", progress=False, overwrite=False
    )


@pytest.mark.parametrize(
    "metadata", [{"jaxstow": "1.0"}, {"jaxstow_header_xxh3": "abc"}, {"note": '"format":"jaxstow"'}]
)
def test_another_tools_file_with_metadata_jaxstow_reserves_is_refused_saying_so(tmp_path, metadata):
    path = tmp_path / "other.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(path), metadata=metadata)
    # was: "the header's checksum does not match: the header is corrupt", of a file whose every byte is as written
    with pytest.raises(CorruptFileError, match="another tool gave its file metadata that jaxstow reserves") as raised:
        jaxstow.load(path)
    assert raised.value.file == str(path) and "rename it in that tool" in str(raised.value)
