"""The folder every hostile case starts from, and how a case is made: :mod:`reliability.folder_cases` holds them.

:func:`write_model` writes a small Hugging Face folder (three shards and ``model.safetensors.index.json``, or shards
alone) of random values. A case then spoils it and returns the folder to load and an :class:`Expect`: the file a
refusal must name, and the tensors a load must return (``None``: it must be refused).
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "CASES",
    "HEADER_BYTES",
    "INDEX_BYTES",
    "INDEX_NAME",
    "MANY_ENTRIES",
    "MANY_TENSORS",
    "SHAPES",
    "SHARD_NAMES",
    "Build",
    "Case",
    "Expect",
    "Model",
    "add",
    "case",
    "outside_file",
    "place",
    "safetensors_bytes",
    "shared",
    "socket_at",
    "write_model",
]

INDEX_NAME = "model.safetensors.index.json"
SHARD_NAMES = [f"model-0000{number}-of-00003.safetensors" for number in (1, 2, 3)]
_LAYOUT = {"embed.w": 0, "head.w": 0, "blocks.0.w": 1, "blocks.0.b": 1, "blocks.1.w": 2, "blocks.1.b": 2}
#: Each tensor's shape and dtype, the same in every folder written.
SHAPES = {
    "embed.w": ((8, 4), np.float32),
    "head.w": ((4, 8), np.float32),
    "blocks.0.w": ((4, 4), np.float32),
    "blocks.0.b": ((4,), np.float32),
    "blocks.1.w": ((4, 4), np.float32),
    "blocks.1.b": ((4,), np.int32),
}
#: Just past the limits of a folder that docs/safety.md states: tensors, index bytes, all shards' header bytes.
MANY_TENSORS = 2**19 + 1
#: An index's entries are counted from its text with room for a few of its metadata's: these are past that room.
MANY_ENTRIES = 2**19 + 2**12
INDEX_BYTES = 64 * 2**20 + 1
HEADER_BYTES = 64 * 2**20 + 1


class Expect(NamedTuple):
    """What a case may come to: refused naming ``culprit`` (when given), or loaded as ``tensors`` (when given)."""

    culprit: str | None
    tensors: dict[str, np.ndarray] | None = None


class Model(NamedTuple):
    """A folder as written: its tensors by name and the shard of each."""

    folder: Path
    tensors: dict[str, np.ndarray]
    weight_map: dict[str, str]

    def shard(self, number: int) -> Path:
        return self.folder / SHARD_NAMES[number]

    @property
    def index(self) -> Path:
        return self.folder / INDEX_NAME

    def write_index(self, value: Any) -> None:
        self.index.write_text(value if isinstance(value, str) else json.dumps(value))

    def without(self, *names: str) -> dict[str, np.ndarray]:
        return {name: array for name, array in self.tensors.items() if name not in names}


#: Builds a case in a fresh folder (``root``), from a random source and a folder of files shared by the cases.
Build = Callable[[Path, random.Random, Path], tuple[Path, Expect]]


class Case(NamedTuple):
    kind: str
    name: str
    build: Build


def safetensors_bytes(tensors: dict[str, np.ndarray], extra: str = "") -> bytes:
    """A plain safetensors file of ``tensors``; ``extra`` is JSON text of more header members (``"a":{...},``)."""
    codes = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}
    entries, data, offset = {}, b"", 0
    for name, array in tensors.items():
        entries[name] = {
            "dtype": codes[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        data += array.tobytes()
        offset += array.nbytes
    text = ("{" + extra + json.dumps(entries, separators=(",", ":"))[1:]).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write_model(folder: Path, rng: random.Random, *, index: bool = True) -> Model:
    """A folder of three shards, with its index unless ``index`` is false; random values each time."""
    numbers = np.random.default_rng(rng.getrandbits(32))
    tensors = {name: (numbers.standard_normal(shape) * 9).astype(dtype) for name, (shape, dtype) in SHAPES.items()}
    folder.mkdir(parents=True, exist_ok=True)
    for number, shard in enumerate(SHARD_NAMES):
        chosen = {name: array for name, array in tensors.items() if _LAYOUT[name] == number}
        (folder / shard).write_bytes(safetensors_bytes(chosen))
    weight_map = {name: SHARD_NAMES[number] for name, number in _LAYOUT.items()}
    model = Model(folder, tensors, weight_map)
    if index:
        model.write_index(
            {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}
        )
    return model


def outside_file(root: Path, model: Model, number: int) -> Path:
    """A safetensors file outside the folder with shard ``number``'s tensor names and other values."""
    (root / "outside").mkdir(exist_ok=True)
    path = root / "outside" / "secret.safetensors"
    names = [name for name, shard in model.weight_map.items() if shard == SHARD_NAMES[number]]
    path.write_bytes(safetensors_bytes({name: model.tensors[name] + 1 for name in names}))
    return path


def shared(cache: Path, name: str, make: Callable[[Path], None]) -> Path:
    """A large file made once per run in ``cache``, linked into each folder that uses it."""
    path = cache / name
    if not path.exists():
        make(path)
    return path


def place(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        target.write_bytes(source.read_bytes())


#: Every case, in the order they were added.
CASES: list[Case] = []


def add(kind: str, name: str, build: Build) -> None:
    CASES.append(Case(kind, name, build))


def case(kind: str, name: str) -> Callable[[Build], None]:
    """Add the decorated function as a case."""
    return lambda build: add(kind, name, build)


def socket_at(path: Path) -> None:
    """A socket at ``path``, bound in a short temporary folder first (a socket's path holds at most 107 bytes)."""
    with tempfile.TemporaryDirectory() as short, socket.socket(socket.AF_UNIX) as server:
        server.bind(os.path.join(short, "s"))
        os.replace(os.path.join(short, "s"), path)
