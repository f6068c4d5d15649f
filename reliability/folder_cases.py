"""Hostile folders of safetensors files, as a download or an unpacked archive may hold them: each case builds one.

Each spoils a folder :func:`~reliability.folder_model.write_model` wrote: its index, a shard, links, special files in
a file's place, or sizes past what a folder may take (the kinds of case), and says what it must come to.
"""

from __future__ import annotations

import json
import os
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import jaxstow
from reliability.folder_model import (
    CASES,
    HEADER_BYTES,
    INDEX_BYTES,
    INDEX_NAME,
    MANY_ENTRIES,
    MANY_TENSORS,
    SHARD_NAMES,
    Expect,
    Model,
    add,
    case,
    outside_file,
    place,
    safetensors_bytes,
    shared,
    socket_at,
    write_model,
)

__all__ = ["CASES"]


def _index_text(text: str | bytes, name: str, *, loads: bool = False) -> None:
    """An index of ``text`` (``@MAP@`` stands for the folder's whole weight map); it must be refused unless ``loads``."""

    def build(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
        model = write_model(root / "hf", rng)
        data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
        model.index.write_bytes(data.replace(b"@MAP@", json.dumps(model.weight_map).encode()))
        return model.folder, Expect(INDEX_NAME, model.tensors if loads else None)

    add("index", name, build)


def _index_edit(name: str, edit: Callable[[dict[str, str]], Any], culprit: str | None = INDEX_NAME) -> None:
    def build(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
        model = write_model(root / "hf", rng)
        model.write_index(edit(dict(model.weight_map)))
        return model.folder, Expect(culprit)

    add("index", name, build)


_DEEP = "[" * 100_000 + "]" * 100_000
for _text, _name in [
    ("", "an empty index"),
    ('{"weight_map": {"embed.w": "model-00001-of-00003.safetensors"', "an index cut short"),
    ('{"weight_map": {}} trailing', "an index with text after it"),
    (b'\xff\xfe{\x00"\x00', "an index in UTF-16"),
    (b'{"weight_map": {"a\xff": "x.safetensors"}}', "an index of bad UTF-8"),
    ("[]", "an index that is a list"),
    ('"model-00001-of-00003.safetensors"', "an index that is a string"),
    ('{"weight_map": {}}', "an empty weight_map"),
    ('{"metadata": {}}', "an index without a weight_map"),
    ('{"weight_map": ["model-00001-of-00003.safetensors"]}', "a weight_map that is a list"),
    ('{"weight_map": null}', "a weight_map that is null"),
    ('{"weight_map": ' + _DEEP + "}", "a weight_map nested 100,000 deep"),
    ('{"metadata": ' + _DEEP + ', "weight_map": {"embed.w": "a.safetensors"}}', "metadata nested 100,000 deep"),
    ('{"metadata": {"total_size": ' + "9" * 5000 + '}, "weight_map": @MAP@}', "an integer of 5000 digits"),
    ('{"weight_map": {"embed.w": NaN}}', "NaN"),
    ('{"weight_map": {"embed.w": "\\ud800.safetensors"}}', "a lone surrogate in a shard name"),
]:
    _index_text(_text, _name)
_index_text('{"metadata": {"total_size": 1e999}, "weight_map": @MAP@}', "a size of 1e999", loads=True)
_index_text(
    '{"metadata": {"total_size": -0.0, "x": [null, {}]}, "weight_map": @MAP@, "more": 1}', "odd metadata", loads=True
)

for _value, _name in [
    (1, "a shard name that is a number"),
    (None, "a shard name that is null"),
    (["model-00001-of-00003.safetensors"], "a shard name that is a list"),
    ({"file": "model-00001-of-00003.safetensors"}, "a shard name that is an object"),
    ("model-00001-of-00003.safetensors\0.txt", "a NUL in a shard name"),
    ("../model-00001-of-00003.safetensors", "a shard name that climbs out"),
    ("/etc/passwd.safetensors", "an absolute shard name"),
    ("sub/model.safetensors", "a shard name in a subfolder"),
    ("..\\model.safetensors", "a shard name with a backslash"),
    (".hidden.safetensors", "a hidden shard name"),
    ("model-00001-of-00003.bin", "a shard that is no .safetensors file"),
    ("", "an empty shard name"),
    ("x" * 300 + ".safetensors", "a shard name of 300 letters"),
    (INDEX_NAME, "the index as its own shard"),
]:
    _index_edit(_name, lambda weights, value=_value: {"weight_map": {**weights, "embed.w": value}})

_index_edit("a tensor its shard lacks", lambda w: {"weight_map": {**w, "lost.w": SHARD_NAMES[1]}}, SHARD_NAMES[1])
_index_edit("a shard that is missing", lambda w: {"weight_map": {**w, "lost.w": "model-9.safetensors"}}, "model-9")
_index_edit("tensor names of odd bytes", lambda w: {"weight_map": {**w, "\0\n\ud800": SHARD_NAMES[0]}}, SHARD_NAMES[0])


@case("index", "a tensor in two shards")
def _twice(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", rng)
    both = {name: model.tensors[name] for name in ("blocks.1.w", "blocks.1.b", "head.w")}
    model.shard(2).write_bytes(safetensors_bytes(both))
    return model.folder, Expect(SHARD_NAMES[2])


@case("index", "a tensor the index leaves out")
def _unmapped(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", rng)
    model.write_index({"weight_map": {name: shard for name, shard in model.weight_map.items() if name != "head.w"}})
    return model.folder, Expect(None, model.without("head.w"))


# -- shards -----------------------------------------------------------------------------------------------------------


def _shard(name: str, make: Callable[[Model, Path], None], *, index: bool = True) -> None:
    def build(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
        model = write_model(root / "hf", rng, index=index)
        number = rng.randrange(3)
        make(model, model.shard(number))
        return model.folder, Expect(SHARD_NAMES[number])

    add("shards", name + ("" if index else ", without an index"), build)


def _shard_tensors(model: Model, path: Path) -> dict[str, np.ndarray]:
    return {name: model.tensors[name] for name, shard in model.weight_map.items() if shard == path.name}


def _jaxstow_file(model: Model, path: Path) -> None:
    path.unlink()
    jaxstow.save(path, {"only": {"w": np.ones(3, np.float32)}})


def _jaxstow_same_names(model: Model, path: Path) -> None:
    path.unlink()
    jaxstow.save(path, {name: array + 1 for name, array in _shard_tensors(model, path).items()})


def _npz(model: Model, path: Path) -> None:
    with open(path, "wb") as file:
        np.savez(file, **_shard_tensors(model, path))


def _header(text: str) -> Callable[[Model, Path], None]:
    def make(model: Model, path: Path) -> None:
        raw = text.encode()
        path.write_bytes(struct.pack("<Q", len(raw)) + raw)

    return make


for _index in (True, False):
    _shard("a jaxstow file", _jaxstow_file, index=_index)
    _shard("a jaxstow file with the shard's tensor names", _jaxstow_same_names, index=_index)
    _shard("an npz archive of the shard's tensors", _npz, index=_index)
_shard("a torch zip", lambda model, path: path.write_bytes(b"PK\x03\x04" + bytes(60)))
_shard("a pickle", lambda model, path: path.write_bytes(b"\x80\x04\x95" + bytes(40)))
_shard("an empty file", lambda model, path: path.write_bytes(b""))
_shard("7 bytes", lambda model, path: path.write_bytes(b"\x10" + bytes(6)))
_shard("random bytes", lambda model, path: path.write_bytes(os.urandom(300)))
_shard("a header length of 2**63", lambda model, path: path.write_bytes(struct.pack("<Q", 2**63) + b"{}"))
_shard("a header past the file's end", lambda model, path: path.write_bytes(struct.pack("<Q", 4096) + b"{}"))
_shard("a header that is a list", _header("[1, 2]"))
_shard("a header nested 100,000 deep", _header('{"a": ' + _DEEP + "}"))
_shard("a header of bad JSON", _header('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]'))
_shard("an unknown dtype", _header('{"embed.w": {"dtype": "X9", "shape": [8, 4], "data_offsets": [0, 128]}}'))
_shard("data beyond the end", _header('{"embed.w": {"dtype": "F32", "shape": [8, 4], "data_offsets": [0, 128]}}'))
_shard(
    "a shape of 2**62", _header('{"embed.w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}}')
)
_shard("metadata that is not strings", _header('{"__metadata__": {"format": 1}}'))
_shard("the data cut short", lambda model, path: path.write_bytes(path.read_bytes()[:-5]))


@case("shards", "a tensor in two shards, without an index")
def _twice_plain(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", rng, index=False)
    model.shard(2).write_bytes(
        safetensors_bytes({**_shard_tensors(model, model.shard(2)), "head.w": np.zeros(1, np.float32)})
    )
    return model.folder, Expect(SHARD_NAMES[2])


# -- links ------------------------------------------------------------------------------------------------------------


def _link_case(name: str, target: Callable[[Path, Model, int], str], *, slot: str = "shard") -> None:
    """A shard (or the index) replaced by a symbolic link to ``target(root, model, number)``."""

    def build(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
        model = write_model(root / "hf", rng)
        number = rng.randrange(3)
        path = model.index if slot == "index" else model.shard(number)
        pointed = target(root, model, number)
        path.unlink()
        path.symlink_to(pointed)
        return model.folder, Expect(path.name)

    add("links", name, build)


def _outside_index(root: Path, model: Model, number: int) -> str:
    (root / "elsewhere").mkdir(exist_ok=True)
    weights = {**model.weight_map, "embed.w": "model-00002-of-00003.safetensors"}
    (root / "elsewhere" / INDEX_NAME).write_text(json.dumps({"weight_map": weights}))
    return str(root / "elsewhere" / INDEX_NAME)


def _chain(root: Path, model: Model, number: int) -> str:
    os.symlink(outside_file(root, model, number), model.folder / "inner.link")
    return "inner.link"


def _loop(root: Path, model: Model, number: int) -> str:
    os.symlink(model.folder / "loop-b", model.folder / "loop-a")
    os.symlink(model.folder / "loop-a", model.folder / "loop-b")
    return str(model.folder / "loop-a")


_link_case("a shard linked to a file outside", lambda root, model, number: str(outside_file(root, model, number)))
_link_case(
    "a shard linked outside by a relative link",
    lambda root, model, number: os.path.relpath(outside_file(root, model, number), model.folder),
)
_link_case("an index linked outside", _outside_index, slot="index")
_link_case("an index linked to /dev/zero", lambda root, model, number: "/dev/zero", slot="index")
_link_case("a shard linked to /dev/zero", lambda root, model, number: "/dev/zero")
_link_case("a shard linked to /dev/urandom", lambda root, model, number: "/dev/urandom")
_link_case("a shard linked to /dev/null", lambda root, model, number: "/dev/null")
_link_case("a dangling shard link", lambda root, model, number: str(root / "nowhere.safetensors"))
_link_case("a dangling index link", lambda root, model, number: str(root / "nowhere.json"), slot="index")
_link_case("a shard link in a loop", _loop)
_link_case("a shard linked to a folder", lambda root, model, number: str(root))
_link_case("a shard linked to /proc/self/environ", lambda root, model, number: "/proc/self/environ")
_link_case("a shard linked through a link outside", lambda root, model, number: _chain(root, model, number))


@case("links", "shards linked inside the folder")
def _inside(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", rng)
    (model.folder / "real").mkdir()
    for number, shard in enumerate(SHARD_NAMES):
        os.replace(model.shard(number), model.folder / "real" / shard)
        link = os.path.join("real", shard) if number != 1 else str(model.folder / "real" / shard)  # relative, absolute
        os.symlink(link, model.shard(number))
    return model.folder, Expect(None, model.tensors)


@case("links", "the folder itself a link")
def _folder_link(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", rng)
    os.symlink(model.folder, root / "alias")
    return root / "alias", Expect(None, model.tensors)


def _hub_cache(root: Path, rng: random.Random, sub: str, into: str) -> tuple[Model, Path]:
    """A Hugging Face cache: ``models--org--name/blobs/<hash>`` and a snapshot of links to them (in ``sub``);
    one shard linked into ``into``'s blobs instead (``into`` is ``"models--org--name"`` for all of them)."""
    repo = root / "hub" / "models--org--name"
    snapshot = repo / "snapshots" / "0123abcd" / sub
    model = write_model(root / "written", rng)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    up = os.path.relpath(root / "hub", snapshot)
    for number, name in enumerate([*SHARD_NAMES, INDEX_NAME]):
        blob = f"{number:040x}"
        repository = into if number == 2 else "models--org--name"
        (root / "hub" / repository / "blobs").mkdir(parents=True, exist_ok=True)
        os.replace(model.folder / name, root / "hub" / repository / "blobs" / blob)
        os.symlink(os.path.join(up, repository, "blobs", blob), snapshot / name)
    return model, snapshot


@case("links", "a Hugging Face cache snapshot")
def _snapshot(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model, snapshot = _hub_cache(root, rng, "", "models--org--name")
    return snapshot, Expect(None, model.tensors)


@case("links", "a subfolder of a Hugging Face cache snapshot")
def _snapshot_sub(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model, snapshot = _hub_cache(root, rng, "transformer", "models--org--name")
    return snapshot, Expect(None, model.tensors)


@case("links", "a snapshot linked into another repository's blobs")
def _other_repo(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    _, snapshot = _hub_cache(root, rng, "", "models--other--repo")
    return snapshot, Expect(SHARD_NAMES[2])


@case("links", "a folder that is no snapshot, linked into ../blobs")
def _fake_blobs(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", rng)
    (root / "blobs").mkdir()
    os.replace(model.shard(1), root / "blobs" / "abc")
    os.symlink("../blobs/abc", model.shard(1))
    return model.folder, Expect(SHARD_NAMES[1])


# -- special files ----------------------------------------------------------------------------------------------------


def _special(name: str, make: Callable[[Path], None], *, slot: str = "shard", index: bool = True) -> None:
    def build(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
        model = write_model(root / "hf", rng, index=index)
        path = model.index if slot == "index" else model.shard(rng.randrange(3))
        path.unlink()
        make(path)
        return model.folder, Expect(path.name)

    add("special files", f"{name} as the {slot}" + ("" if index else ", without an index"), build)


for _slot in ("index", "shard"):
    _special("a FIFO", os.mkfifo, slot=_slot)
    _special("a folder", os.mkdir, slot=_slot)
    _special("a socket", socket_at, slot=_slot)
_special("a FIFO", os.mkfifo, index=False)
_special("a folder", os.mkdir, index=False)


# -- sizes ------------------------------------------------------------------------------------------------------------


def _many_entries(path: Path) -> None:
    """A safetensors file of ``MANY_TENSORS`` empty tensors: a header of about 30 MB."""
    empty = '"{}":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}},'
    path.write_bytes(safetensors_bytes({}, "".join(empty.format(f"e{number:x}") for number in range(MANY_TENSORS))))


@case("sizes", f"a shard of {MANY_TENSORS} empty tensors")
def _many(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", rng, index=rng.random() < 0.5)
    place(shared(cache, "many.safetensors", _many_entries), model.shard(0))
    return model.folder, Expect(SHARD_NAMES[0])


@case("sizes", f"an index of {MANY_ENTRIES} tensors")
def _many_index(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", rng)

    def make(path: Path) -> None:
        entries = ",".join(f'"e{number:x}":"{SHARD_NAMES[0]}"' for number in range(MANY_ENTRIES))
        path.write_text('{"weight_map":{' + entries + "}}")

    place(shared(cache, "many.index.json", make), model.index)
    return model.folder, Expect(INDEX_NAME)


@case("sizes", "an index of 64 MiB and a byte")
def _big_index(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", rng)
    text = json.dumps({"weight_map": model.weight_map}).encode()

    def make(path: Path) -> None:
        with open(path, "wb") as file:
            file.write(text[:-1] + b" " * (INDEX_BYTES - len(text)) + b"}")

    big = shared(cache, f"big-{len(text)}.index.json", make)
    place(big, model.index)
    return model.folder, Expect(INDEX_NAME, model.tensors)  # refused, or read as it is


@case("sizes", "shards whose headers pass 64 MiB together")
def _long_headers(root: Path, rng: random.Random, cache: Path) -> tuple[Path, Expect]:
    model = write_model(root / "hf", random.Random(0))  # the same values every time: the shards are made once

    def padded(number: int) -> Callable[[Path], None]:
        def write(path: Path) -> None:
            data = model.shard(number).read_bytes()
            (length,) = struct.unpack("<Q", data[:8])
            padding = HEADER_BYTES // 2 + 8
            path.write_bytes(
                struct.pack("<Q", length + padding) + data[8 : 8 + length] + b" " * padding + data[8 + length :]
            )

        return write

    for number in (0, 1):
        place(shared(cache, f"long-{number}.safetensors", padded(number)), model.shard(number))
    return model.folder, Expect(SHARD_NAMES[1], model.tensors)  # refused, or read as it is
