"""Untrusted files and faults: foreign files, damaged and crafted headers, npz anomalies, the name policy, checkpoint
records, temporary files of failed saves."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import zipfile

import equinox as eqx
import forked
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xxhash

import jaxstow
from jaxstow._format.manifest import FORMAT_VERSION
from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow._write.encoded import encode_tree
from jaxstow.errors import (
    ArgumentError,
    CheckpointError,
    CorruptFileError,
    FormatError,
    JaxstowError,
    NewerFormatError,
    RefusedNameError,
    UnsaveableObjectError,
)
from reliability.forge import forge_native, split_native

TREE = {"w": np.arange(6, dtype=np.float32), "depth": 3, "act": jax.nn.relu}


def _saved(tmp_path, tree=TREE, name="model.jxs") -> bytes:
    jaxstow.save(tmp_path / name, tree)
    return (tmp_path / name).read_bytes()


def _forged(tmp_path, edit) -> str:
    """A native file whose manifest ``edit`` changed; its header checksum is valid."""
    frozen = encode_tree(TREE)
    edit(frozen.manifest)
    path = tmp_path / "forged.jxs"
    frozen.write(path)
    return str(path)


# -- what a file is -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        np.random.default_rng(0).bytes(5000),
        pickle.dumps({"a": 1}),
        b"\x93NUMPY\x01\x00v\x00{'descr': '<f8'}" + b" " * 200,
    ],
    ids=["random bytes", "pickle", "npy"],
)
def test_a_foreign_file_is_named_as_such(tmp_path, content):
    path = tmp_path / "foreign.bin"
    path.write_bytes(content)
    with pytest.raises(FormatError, match=r"foreign\.bin: (is an? [^:]*, )?not a jaxstow, safetensors or npz file"):
        jaxstow.load(path)


def test_the_error_of_a_file_that_is_none_shows_none_of_its_bytes(tmp_path):
    # It quoted the first 16: a checkpoint's symlink to a token file put the token in the message, and in the logs.
    (tmp_path / "token").write_bytes(b"hf_SECRETSECRETSECRET\n")
    (tmp_path / "model.jxs").symlink_to(tmp_path / "token")
    with pytest.raises(FormatError, match="not a jaxstow, safetensors or npz file") as caught:
        jaxstow.load(tmp_path / "model.jxs")
    assert "SECRET" not in str(caught.value)


def test_details_nested_deeper_than_python_copies_are_a_format_error(tmp_path):
    # Deeper than a file holds, within what the JSON parser reads: copied before the limits were checked, a bare
    # RecursionError from load, open and the command.
    data = _saved(tmp_path, {"w": np.arange(3.0), "v": 1})
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    deep = "[" * 510 + "]" * 510
    manifest = header["__metadata__"]["jaxstow"].replace('"details":{', '"details":{"1":{"junk":' + deep + "},", 1)
    header["__metadata__"].update(jaxstow="MANIFEST", jaxstow_header_xxh3="0" * 16)
    text = json.dumps(header, separators=(",", ":")).replace('"MANIFEST"', json.dumps(manifest)).encode()
    text = text[:-19] + xxhash.xxh3_64_hexdigest(text).encode() + b'"}}'
    path = tmp_path / "deep.jxs"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])
    for read in (jaxstow.load, jaxstow.open):
        with pytest.raises(FormatError, match=r"deep\.jxs: the manifest nests deeper than a jaxstow file"):
            read(path)


@pytest.mark.parametrize("key", [b'"jaxstow":"', b'"jaxstow_header_xxh3":"', b'"__metadata__":'])
def test_every_flip_in_a_metadata_key_is_a_corrupt_file(tmp_path, key):
    original = _saved(tmp_path)
    start = original.index(key) + 1
    for position in range(start, start + len(key) - 4):
        for bit in range(8):
            damaged = bytearray(original)
            damaged[position] ^= 1 << bit
            with pytest.raises(CorruptFileError, match="header"):
                jaxstow.load(io.BytesIO(bytes(damaged)))


def test_a_malformed_version_is_malformed_and_a_newer_one_newer(tmp_path):
    with pytest.raises(FormatError, match=r"malformed format version '1\.1'"):
        jaxstow.load(_forged(tmp_path, lambda manifest: manifest.update(version="1.1")))
    with pytest.raises(FormatError, match=f"format {FORMAT_VERSION + 1} is newer than this jaxstow"):
        jaxstow.load(_forged(tmp_path, lambda manifest: manifest.update(version=FORMAT_VERSION + 1)))


def test_a_version_1_file_that_describes_every_leaf_loads(tmp_path):
    def as_version_1(manifest):
        manifest["version"] = 1
        manifest["leaves"][-1].update(dtype="float32", shape=[6])  # 'w', whose entry version 2 leaves to its tensor

    restored = jaxstow.load(_forged(tmp_path, as_version_1), as_numpy=True)
    assert restored["w"].tolist() == TREE["w"].tolist() and restored["depth"] == 3


def test_an_entry_with_only_half_of_its_layout_is_malformed(tmp_path):
    with pytest.raises(FormatError, match=r"leaf 'w'.*no shape is given: a shape is a list of non-negative integers"):
        jaxstow.load(_forged(tmp_path, lambda manifest: manifest["leaves"][-1].update(dtype="float32")))


# -- crafted headers ------------------------------------------------------------------------------------------------


def test_deep_nesting_is_a_format_error(tmp_path):
    path = tmp_path / "deep.safetensors"
    header = b"{" + b'"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}" + b" " * 1_100_000  # 1 array per 13 bytes
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(FormatError, match=r"deep\.safetensors: the header is not valid JSON \(maximum recursion depth"):
        jaxstow.load(path)
    tensors, manifest, data = split_native(_saved(tmp_path))
    deep = manifest.replace('"metadata":null', '"metadata":' + "[" * 100_000 + "]" * 100_000)
    with pytest.raises(FormatError, match="the jaxstow manifest is not valid JSON"):
        jaxstow.load(io.BytesIO(forge_native(tensors, deep, data)))


@pytest.mark.parametrize("kind", ["tuple", "list"])
def test_a_structure_nested_beyond_the_limit_is_refused_before_recursing(kind):
    from jaxstow._format.json_values import MAX_NESTING

    levels = MAX_NESTING // 2 + 20  # valid JSON that json.loads parses, deeper than the decoders recurse
    nested = f'{{"{kind}":[' * levels + "%s" + "]}" * levels
    manifest = '{"format":"jaxstow","version":1,"metadata":null,"structure":%s,"leaves":[%s]}'
    for text in (
        manifest % (nested % '"*"', '{"path":"","kind":"value","value":1}'),
        manifest % ('"*"', '{"path":"","kind":"value","value":%s}' % (nested % "1")),
    ):
        with pytest.raises(FormatError, match=f"nests deeper than {MAX_NESTING} JSON levels"):
            jaxstow.load(io.BytesIO(forge_native({}, text)))


@pytest.mark.parametrize("suffix", ["jxs", "npz"])
def test_a_tree_too_deep_to_load_is_refused_at_save_and_one_level_less_round_trips(tmp_path, suffix):
    from jaxstow._format.json_values import MAX_NESTING

    def nested(levels):
        tree = np.ones(1, np.float32)
        for _ in range(levels):
            tree = [tree]
        return tree

    deepest = MAX_NESTING // 2  # a list node is two JSON levels
    jaxstow.save(tmp_path / f"ok.{suffix}", nested(deepest))
    assert probes_same(jaxstow.load(tmp_path / f"ok.{suffix}", as_numpy=True), nested(deepest))
    with pytest.raises(FormatError, match=f"the structure nests {MAX_NESTING + 2} JSON levels deep"):
        jaxstow.save(tmp_path / f"deep.{suffix}", nested(deepest + 1))
    assert not (tmp_path / f"deep.{suffix}").exists()


def test_an_integer_of_5000_digits_is_a_format_error(tmp_path):
    tensors, manifest, data = split_native(_saved(tmp_path))
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # only to write the forged file; loading runs under the usual limit
    try:
        tensors["w"]["data_offsets"][1] = int("9" * 5000)
        forged = forge_native(tensors, manifest, data)
    finally:
        sys.set_int_max_str_digits(limit)
    with pytest.raises(CorruptFileError, match="the header is not valid JSON"):
        jaxstow.load(io.BytesIO(forged))


@pytest.mark.parametrize(
    "structure", [{"dict": 5}, {"dict": [1, 2]}, {"tuple": 3}, {"node": "jax.nn.relu", "children": []}]
)
def test_structure_entries_of_the_wrong_type_are_format_errors(tmp_path, structure):
    with pytest.raises(FormatError):
        jaxstow.load(_forged(tmp_path, lambda manifest: manifest.update(structure=structure)))


@pytest.mark.parametrize(
    ("impl", "message"), [("bogus", "unknown PRNG key implementation"), ("rbg", "stored as uint32")]
)
def test_a_key_with_a_bad_implementation_is_a_format_error(tmp_path, impl, message):
    frozen = encode_tree({"key": jax.random.key(0)})
    frozen.manifest["leaves"][0]["impl"] = impl
    frozen.write(tmp_path / "key.jxs")
    with pytest.raises(FormatError, match=rf"leaf 'key'.*{message}"):
        jaxstow.load(tmp_path / "key.jxs")


# -- npz ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a\0b", "a\\b", "../x", "/abs", "a/./b", "__jaxstow__", "\ud800"])
def test_leaf_names_an_npz_cannot_hold_are_refused_at_save(tmp_path, name):
    with pytest.raises(FormatError, match=re.escape(f"leaf {name!r} of ")) as raised:
        jaxstow.save(tmp_path / "x.npz", {name: np.ones(2)})
    assert "x.npz: an npz archive cannot hold this leaf name" in str(raised.value)
    assert raised.value.file is not None and raised.value.file.endswith("x.npz")
    assert list(tmp_path.iterdir()) == []


def test_a_leaf_named_like_the_safetensors_metadata_is_refused_at_save(tmp_path):
    with pytest.raises(FormatError, match=r"leaf '__metadata__' of .*x\.jxs: a safetensors file cannot hold a tensor"):
        jaxstow.save(tmp_path / "x.jxs", {"__metadata__": np.ones(2)})
    assert list(tmp_path.iterdir()) == []
    jaxstow.save(tmp_path / "x.jxs", {"__metadata__": 3})  # a value, not a tensor: the manifest holds it
    assert jaxstow.load(tmp_path / "x.jxs") == {"__metadata__": 3}


def test_leaf_names_round_trip_where_the_format_can_hold_them(tmp_path):
    tree = {"a\0b": np.ones(2, np.float32), "c\\d": np.zeros(1, np.int8)}
    assert probes_same(jaxstow.load(io.BytesIO(_saved(tmp_path, tree)), as_numpy=True), tree)
    nested = {"a": {"b": np.ones(2, np.float32)}, "a/b ": np.zeros(1, np.int8), "c": {"": np.ones(1, np.int8)}}
    assert probes_same(jaxstow.load(io.BytesIO(_saved(tmp_path, nested, "n.npz")), as_numpy=True), nested)
    root = np.arange(3, dtype=np.int16)  # a bare array: the member named ".npy"
    assert probes_same(jaxstow.load(io.BytesIO(_saved(tmp_path, root, "r.npz")), as_numpy=True), root)


def probes_same(a, b) -> bool:
    from reliability.outcomes import same

    return same(a, b)


def test_every_flip_in_the_central_directory_is_detected_or_harmless(tmp_path):
    original = _saved(tmp_path, TREE, "model.npz")
    reference = jaxstow.load(io.BytesIO(original), as_numpy=True)
    directory = original.index(b"PK\x01\x02")
    for position in range(directory, len(original)):
        for bit in range(0, 8, 3):
            damaged = bytearray(original)
            damaged[position] ^= 1 << bit
            try:
                restored = jaxstow.load(io.BytesIO(bytes(damaged)), as_numpy=True)
            except JaxstowError:
                continue
            assert probes_same(restored, reference), f"byte {position} bit {bit}"


def test_zip_anomalies_are_corrupt_files(tmp_path):
    original = _saved(tmp_path, TREE, "model.npz")
    directory = original.index(b"PK\x01\x02")
    for offset, value in [(8, 1), (10, 99), (6, 0xFF)]:  # encrypted, compression method 99, version 255
        damaged = bytearray(original)
        damaged[directory + offset] = value
        with pytest.raises(CorruptFileError, match=r"model|BytesIO"):
            jaxstow.load(io.BytesIO(bytes(damaged)))
    hidden = bytearray(original)  # a comment length that swallows the next entries of the directory
    hidden[directory + 32] = 0x7F
    with pytest.raises(CorruptFileError):
        jaxstow.load(io.BytesIO(bytes(hidden)))


def test_a_plain_npz_with_a_member_that_is_not_an_array_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "odd.npz", "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(FormatError, match=r"odd\.npz: the member 'readme.txt' is not an \.npy array"):
        jaxstow.load(tmp_path / "odd.npz")


def test_an_npz_whose_manifest_member_was_renamed_is_damage_not_a_plain_npz(tmp_path):
    jaxstow.save(tmp_path / "model.npz", {"k": jnp.array([1.0, 2.0], jnp.bfloat16), "s": 3})
    with zipfile.ZipFile(tmp_path / "model.npz") as source, zipfile.ZipFile(tmp_path / "edited.npz", "w") as edited:
        for info in source.infolist():
            edited.writestr(info.filename.replace("__jaxstow__", "__jaxstox__"), source.read(info))
    with pytest.raises(CorruptFileError, match="holds a jaxstow manifest as the member '__jaxstox__'"):
        jaxstow.load(tmp_path / "edited.npz")  # was a flat dict: k as uint8 [128, 63, 0, 64], s gone


# -- the name policy ------------------------------------------------------------------------------------------------


def test_a_model_naming_numpy_savetxt_is_refused_at_load_and_harms_nothing(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    model = eqx.nn.MLP(2, 2, 4, 1, activation=jax.tree_util.Partial(jnp.tanh), key=jax.random.key(0))
    jaxstow.save(tmp_path / "model.jxs", model)
    assert jaxstow.load(tmp_path / "model.jxs").activation.func is jnp.tanh  # partials over allowed functions load
    jaxstow.save(
        tmp_path / "evil.jxs", eqx.tree_at(lambda m: m.activation, model, jax.tree_util.Partial(jnp.tanh, str(victim)))
    )
    tensors, text, data = split_native((tmp_path / "evil.jxs").read_bytes())
    tanh = json.dumps(jaxstow._names.registry.name_of(jnp.tanh))
    assert text is not None and tanh in text
    (tmp_path / "evil.jxs").write_bytes(forge_native(tensors, text.replace(tanh, '"numpy.savetxt"'), data))
    with pytest.raises(RefusedNameError, match=r"'numpy.savetxt', which jaxstow's name policy refuses"):
        jaxstow.load(tmp_path / "evil.jxs")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize(
    "name",
    [
        "numpy.savetxt", "numpy.load", "numpy.save", "numpy.fromfile", "numpy.memmap", "numpy.zeros", "jax.numpy.load",
        "jax.numpy.empty", "jax.nn.initializers.normal", "jax.random.normal", "jax.lax.full", "jax.lax.while_loop",
        "equinox.tree_deserialise_leaves",
        "flax.serialization.from_bytes",
    ],
)  # fmt: skip
def test_names_that_read_write_or_allocate_are_refused(name):
    pytest.importorskip("flax.serialization")  # imported, so only the policy can refuse it

    with pytest.raises(RefusedNameError, match="name policy"):
        jaxstow._names.registry.lookup(name)
    with pytest.raises(jaxstow.errors.UnsaveableObjectError):
        jaxstow.save(io.BytesIO(), {"f": jaxstow._names.registry._find_imported(name)})


@pytest.mark.parametrize(
    "name",
    [
        "jax.nn.relu",
        "jax.numpy.tanh",
        "jax.numpy.linalg.norm",
        "numpy.exp",
        "jax.numpy.ravel",
        "numpy.mean",
        "jax.numpy.bfloat16",
        "numpy.float32",
        "optax.ScaleByAdamState",
        "jax.scipy.special.erf",
        "equinox.nn.Lambda",
        "jax.lax.dot_general",
    ],
)
def test_pure_functions_and_classes_are_allowed(name):
    pytest.importorskip("optax")

    assert jaxstow._names.registry.lookup(name) is not None


@pytest.mark.parametrize("name", [None, "tests.numpy_io_on_purpose"])
@pytest.mark.parametrize("function", [np.save, np.savetxt, np.fromfile, jnp.load], ids=lambda f: f.__name__)
def test_an_io_function_of_numpy_is_never_registered(function, name):
    # It was, under its own name or another: a file naming it saved, and loaded where it was registered.
    with pytest.raises(ArgumentError, match="which a file may never name, registered or not"):
        jaxstow.saveable(function, name=name)
    assert jaxstow._names.registry.name_of(function) is None  # registered under no name


def test_the_advice_for_an_io_function_in_a_tree_is_not_to_register_it(tmp_path):
    with pytest.raises(UnsaveableObjectError) as refused:
        jaxstow.save(tmp_path / "m.jxs", {"act": jax.tree_util.Partial(np.savetxt, "victim.txt")})
    assert "numpy.savetxt is not an activation" in str(refused.value) and "registering it is refused" in str(
        refused.value
    )


def test_a_registered_function_of_ones_own_is_the_users_choice():
    def clip6(x):
        return jnp.clip(x, 0, 6)

    assert jaxstow.saveable(clip6, name="tests.clip6") is clip6


# -- saves that fail ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["jxs", "npz"])
def test_a_save_beyond_the_file_size_limit_removes_its_temporary_file(tmp_path, suffix):
    """A real write error from the kernel (EFBIG under RLIMIT_FSIZE): the flush in close() fails again."""
    path = tmp_path / f"model.{suffix}"
    jaxstow.save(path, {"w": np.zeros(10, np.float32)})
    before = path.read_bytes()
    script = textwrap.dedent(
        """
        import resource, signal, sys, numpy as np, jaxstow
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            jaxstow.save(sys.argv[1], {"w": np.ones(1 << 20, np.float32)})
        except OSError as error:
            print("failed", error.errno)
        """
    )
    result = forked.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("failed"), result.stdout + result.stderr
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_next_save_removes_temporary_files_of_dead_writers_only(tmp_path):
    dead = int(forked.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    jaxstow.save(tmp_path / "model.jxs", TREE)
    [name] = os.listdir(tmp_path)
    from jaxstow._storage.atomic import temporary_sibling

    mine = temporary_sibling(str(tmp_path / "model.jxs"))
    theirs = mine.replace(f"{TEMPORARY_MARKER}{os.getpid()}-", f"{TEMPORARY_MARKER}{dead}-")
    for path in (mine, theirs):
        open(path, "wb").close()
    jaxstow.save(tmp_path / "model.jxs", TREE)
    assert sorted(os.listdir(tmp_path)) == sorted([name, os.path.basename(mine)])


def _in_another_pid_namespace() -> list[str]:
    """The command prefix that runs a program in a PID namespace of its own, as a container sharing this host's name
    (``docker run --network host``) does; skips the test where the system refuses one."""
    for prefix in (["unshare", "--pid", "--fork"], ["unshare", "--user", "--map-root-user", "--pid", "--fork"]):
        if shutil.which("unshare") and subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    pytest.skip("this system runs no program in a PID namespace of its own (unshare)")


def test_a_save_from_another_pid_namespace_leaves_the_temporary_file_of_a_save_under_way_here(tmp_path):
    from jaxstow._storage.atomic import temporary_sibling

    under_way = temporary_sibling(str(tmp_path / "big.jxs"))  # a save of this live process, writing
    open(under_way, "wb").close()
    save = "import sys, numpy as np, jaxstow; jaxstow.save(sys.argv[1], {'w': np.ones(2)})"
    command = [*_in_another_pid_namespace(), sys.executable, "-c", save, str(tmp_path / "small.jxs")]
    subprocess.run(command, check=True, capture_output=True)
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(under_way), "small.jxs"])


# -- checkpoint records ---------------------------------------------------------------------------------------------


@pytest.fixture
def run(tmp_path):
    with jaxstow.CheckpointManager(tmp_path) as manager:
        for step in (1, 2):
            manager.save(step, {"p": {"w": np.full(3, step, np.float32)}, "o": np.ones(2)}, metrics={"loss": 0.125})
    return tmp_path


@pytest.mark.parametrize(
    ("old", "new"), [(b"0.125", b"0.135"), (b'"p"', b'"q"'), (b'"p.safetensors"', b'"q.safetensors"')]
)
def test_a_changed_record_is_a_corrupt_file_naming_the_step(run, old, new):
    record = run / "2" / "checkpoint.json"
    record.write_bytes(record.read_bytes().replace(old, new, 1))
    manager = jaxstow.CheckpointManager(run)
    with pytest.raises(CorruptFileError, match=r"/2/checkpoint\.json: the record's checksum does not match"):
        manager.restore()
    assert list(manager.damaged_steps()) == [2]
    assert manager.latest_intact_step() == 1
    assert manager.restore(manager.latest_intact_step(), as_numpy=True)["p"]["w"].tolist() == [1, 1, 1]


def test_a_missing_or_swapped_item_file_is_named(run):
    os.replace(run / "1" / "o.safetensors", run / "2" / "o.safetensors")
    manager = jaxstow.CheckpointManager(run)
    with pytest.raises(CheckpointError, match=r"/1/o\.safetensors: step 1 lists the item 'o', but its file is missing"):
        manager.metrics(1)
    (run / "2" / "p.safetensors").write_bytes((run / "1" / "p.safetensors").read_bytes())
    with pytest.raises(CorruptFileError, match=r"/2/p\.safetensors: the header of item 'p' of step 2 has checksum"):
        manager.restore(2)
    assert sorted(manager.damaged_steps()) == [1, 2] and manager.latest_intact_step() is None


def test_a_record_from_a_newer_jaxstow_names_its_version(run):
    record = run / "2" / "checkpoint.json"
    text = record.read_text().replace('"record_version": 2', '"record_version": 3')
    record.write_text(text.replace(f'"jaxstow {jaxstow.__version__}"', '"jaxstow 9.1.0"'))
    with pytest.raises(NewerFormatError, match=r"written by 'jaxstow 9\.1\.0' \(record version 3\).*upgrade jaxstow"):
        jaxstow.CheckpointManager(run).metrics(2)


def test_a_shard_box_a_file_stores_twice_is_damage_whichever_copy_a_read_would_take(tmp_path):
    from forked_cli import jaxstow_command
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(jax.make_mesh((4,), ("x",)), P("x"))
    jaxstow.save(tmp_path / "good.jxs", {"v": jax.device_put(np.arange(8, dtype=np.float32), sharding)})
    tensors, manifest_text, data = split_native((tmp_path / "good.jxs").read_bytes())
    manifest = json.loads(manifest_text)
    [shards] = [detail["shards"] for detail in manifest["details"].values()]
    tensors["evil"] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
    evil = np.full(2, 666, np.float32).tobytes()
    shards.append({"tensor": "evil", "box": shards[0]["box"], "xxh3": xxhash.xxh3_64_hexdigest(evil)})  # rows 0:2 again
    forged = tmp_path / "forged.jxs"
    forged.write_bytes(forge_native(tensors, json.dumps(manifest), data + evil))
    for read in (
        lambda: jaxstow.load(forged),
        lambda: jaxstow.load(forged, sharding=sharding),
        lambda: jaxstow.open(forged),
    ):
        with pytest.raises(FormatError, match=r"leaf 'v' of .*forged\.jxs: the shard box \[\[0, 2\]\] is stored twice"):
            read()
    verified = jaxstow_command("verify", str(forged))
    assert verified.returncode == 1 and "DAMAGED" in verified.stdout, verified.stdout + verified.stderr

    del shards[-1]["xxh3"]  # the same file, the copy unchecked: every shard of a file of version 3 on has a checksum
    forged.write_bytes(forge_native(tensors, json.dumps(manifest), data + evil))
    with pytest.raises(CorruptFileError, match=r"leaf 'v' of .*forged\.jxs: a shard of this leaf has no checksum"):
        jaxstow.load(forged)


def test_a_bool_tensor_of_bytes_other_than_0_and_1_is_damage_however_it_is_read(tmp_path):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    header = json.dumps({"m": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "mask.safetensors"  # jax would print True where x == True is False, and sum it otherwise
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes([1, 2, 0, 1]))
    sharding = NamedSharding(jax.make_mesh((4,), ("x",)), P("x"))
    reads = [
        lambda: jaxstow.load(path),
        lambda: jaxstow.load(path, pipeline=True),  # an accelerator's default
        lambda: jaxstow.load(path, sharding=sharding),
        lambda: jaxstow.open(path)["m"],
        lambda: jaxstow.open(path).read("m", np.s_[0:2]),
        lambda: jaxstow.open(path, mmap=True)["m"],
        lambda: jaxstow.load(tmp_path),  # the file as a folder's one shard
        lambda: jaxstow.load(tmp_path, sharding=sharding),
    ]
    for read in reads:
        with pytest.raises(CorruptFileError, match=r"leaf 'm' of .*: a bool tensor holds bytes other than 0 and 1"):
            read()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes([1, 1, 0, 1]))
    assert jaxstow.load(path, as_numpy=True)["m"].tolist() == [True, True, False, True]


def test_a_structure_that_names_its_leaves_otherwise_than_the_paths_is_damage(tmp_path):
    from forked_cli import jaxstow_command

    jaxstow.save(tmp_path / "good.jxs", {"lr": np.float32([0.001]), "step": np.int32([1000])})
    tensors, manifest_text, data = split_native((tmp_path / "good.jxs").read_bytes())
    manifest = json.loads(manifest_text)
    manifest["structure"]["dict"].reverse()  # the keys swapped: each array would come back under the other's name
    forged = tmp_path / "forged.jxs"
    forged.write_bytes(forge_native(tensors, json.dumps(manifest), data))
    with pytest.raises(CorruptFileError, match=r"forged\.jxs: the structure names leaf 0 'step', but the manifest's"):
        jaxstow.load(forged)
    verified = jaxstow_command("verify", str(forged))
    assert verified.returncode == 1 and "DAMAGED" in verified.stdout, verified.stdout + verified.stderr


@pytest.mark.parametrize(
    "tree",
    [
        {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5), "opt": "node"},
        {(0, "a"): np.arange(12, dtype=np.float32).reshape(3, 4), (0, "b"): np.arange(5)},
    ],
    ids=["beside an optax state", "tuple keys"],
)
def test_dict_keys_swapped_in_a_structure_the_paths_cannot_check_are_damage(tmp_path, tree):
    from forked_cli import jaxstow_command

    optax = pytest.importorskip("optax")
    tree = {key: optax.EmptyState() if isinstance(value, str) else value for key, value in tree.items()}
    jaxstow.save(tmp_path / "good.jxs", tree)
    tensors, manifest_text, data = split_native((tmp_path / "good.jxs").read_bytes())
    manifest = json.loads(manifest_text)
    pairs = manifest["structure"]["dict"]
    pairs[0][0], pairs[1][0] = pairs[1][0], pairs[0][0]  # "a" would come back with b's array, every checksum right
    forged = tmp_path / "forged.jxs"
    forged.write_bytes(forge_native(tensors, json.dumps(manifest), data))
    with pytest.raises(CorruptFileError, match=r"forged\.jxs: the structure lists the dict's key .*'b'.* before .*'a'"):
        jaxstow.load(forged)
    with pytest.raises(CorruptFileError, match="before"):
        jaxstow.load(forged, as_numpy=True)
    verified = jaxstow_command("verify", str(forged))
    assert verified.returncode == 1 and "DAMAGED" in verified.stdout, verified.stdout + verified.stderr
    assert jaxstow.load(tmp_path / "good.jxs", as_numpy=True).keys() == tree.keys()


def test_an_npz_member_longer_by_its_central_directory_than_by_its_local_header_is_damage(tmp_path):
    jaxstow.save(tmp_path / "m.npz", {"w": np.arange(6, dtype=np.float32)})
    data = bytearray((tmp_path / "m.npz").read_bytes())
    entry = data.find(b"PK\x01\x02")
    struct.pack_into("<I", data, entry + 20, struct.unpack_from("<I", data, entry + 20)[0] + 16)
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=r"(?i)overlapped entries"):  # on every Python, not from 3.12 on only
        jaxstow.load(tmp_path / "bad.npz")
