"""Crafted input: headers and manifests changed at random with valid checksums, and trees with odd keys and leaves."""

from __future__ import annotations

import collections
import copy
import io
import json
import random
import time
import tracemalloc
from typing import Any

import jax
import ml_dtypes
import numpy as np

import jaxstow
from jaxstow._format.manifest import CHECKSUMMED, KIND_NAMES, plain_metadata
from jaxstow.errors import JaxstowError
from reliability.forge import forge_native, split_native
from reliability.outcomes import Result, attempt, attempt_any, sample_tree, saved_bytes

# -- odd trees -------------------------------------------------------------------------------------------------------

_ODD_KEYS = ("", "/", "a/b", "..", ".", "\0", "\\", "__jaxstow__", "__metadata__", "é", "\ud800", "x" * 300, "0")
_Pair = collections.namedtuple("_Pair", "first second")


def _odd_leaf(rng: random.Random) -> Any:
    return rng.choice(
        [
            0, -0.0, float("nan"), float("inf"), 2**80, 1e-320, True, None, "", "s\0", "\ud800x", b"\0\xff", 1 + 2j,
            np.ones(2, np.float32), np.zeros((0, 3)), np.array(1.5), np.float16(2), np.int64(2**62), np.bool_(True),
            np.ones(3).astype(ml_dtypes.bfloat16), np.ones(3).astype(ml_dtypes.int4), np.complex64(1j),
            jax.random.key(1), jax.nn.relu,
        ]
    )  # fmt: skip


def _odd_tree(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.random()
    if depth > 3 or choice < 0.4:
        return _odd_leaf(rng)
    if choice < 0.55:
        return {key: _odd_tree(rng, depth + 1) for key in rng.sample(_ODD_KEYS, rng.randint(0, 3))}
    if choice < 0.6:
        return {key: _odd_tree(rng, depth + 1) for key in rng.sample([0, -1, 2**70, 7], rng.randint(0, 3))}
    if choice < 0.75:
        return [_odd_tree(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if choice < 0.9:
        return tuple(_odd_tree(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    return _Pair(_odd_tree(rng, depth + 1), _odd_tree(rng, depth + 1))


def odd_trees(trials: int, rng: random.Random) -> Result:
    """Trees with odd keys and leaves (NUL, separators, ``..``, lone surrogates, NaN, -0.0, huge integers, every
    dtype) saved as ``.jxs`` and ``.npz``: each must be refused at save with a jaxstow error or come back identical;
    never saved and then unreadable."""
    result = Result("odd trees saved and loaded")
    for trial in range(trials):
        tree = _odd_tree(rng)
        sink = io.BytesIO()
        sink.name = ("odd.jxs", "odd.npz")[trial % 2]
        try:
            jaxstow.save(sink, tree)
        except JaxstowError:
            result.add("detected")
            continue
        except Exception as error:
            result.add("lost", f"save raised {type(error).__name__}: {str(error)[:120]}")
            continue
        sink.seek(0)
        outcome, note = attempt(lambda source=sink: jaxstow.load(source, as_numpy=True), tree)
        result.add("lost" if outcome == "detected" else outcome, note or f"saved, then refused: {sink.name}")
    return result


# -- fuzzed headers -------------------------------------------------------------------------------------------------

_NAMES = (
    "numpy.savetxt", "numpy.load", "numpy.fromfile", "numpy.memmap", "jax.numpy.load", "os.system", "builtins.eval",
    "subprocess.Popen", "importlib.import_module", "pickle.loads", "jax._src.pickle_util.loads",
    "flax.serialization.from_bytes", "equinox.tree_deserialise_leaves", "jax.nn.relu", "equinox.nn.MLP",
    "jax.tree_util.Partial", "collections.OrderedDict", "builtins.dict", "numpy.tanh", "no.such.thing",
)  # fmt: skip
_ODD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 3, 2**31, 2**63, -(2**63), 0.5, "", "*", "x" * 40, "float32", "U8", "F32",
    "threefry2x32", "value", "array", "key", [], {}, [1, 2], [-1], [0, -5], [[]], [0, 2**62], [2**62, 0, 4],
    [0, 2**63], [3_037_000_500, 3_037_000_500], [0, 2**40, 2**40], [1] * 70, {"dict": 5}, {"dict": [1, 2]},
    {"dict": [[1, 2, 3]]}, {"tuple": 3}, {"list": [[]]}, {"float": "x"}, {"float": 5}, {"complex": 5},
    {"complex": ["1", "2", "3"]}, {"npscalar": "float32", "bytes": "AAAA"}, {"npscalar": "object", "bytes": ""},
    {"bytes": "!!"}, {"dtype": "object"}, {"treedef": 5}, {"treedef": {"node": "builtins.dict"}},
    {"node": "jax.tree_util.Partial", "aux": {"ref": "numpy.savetxt"}, "children": ["*"]},
    {"node": "equinox.nn.MLP", "aux": 5, "children": []}, "@@BIG@@", "@@DEEP@@", "@@HUGEFLOAT@@",
)  # fmt: skip


def _odd_value(rng: random.Random) -> Any:
    if rng.random() < 0.25:
        return {"ref": rng.choice(_NAMES)} if rng.random() < 0.7 else {"node": rng.choice(_NAMES), "children": []}
    return copy.deepcopy(rng.choice(_ODD_VALUES))


def _slots(node: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) pair of a JSON value, for picking a place to change."""
    out: list[tuple[Any, Any]] = []
    stack = [node]
    while stack:
        current = stack.pop()
        pairs = (
            current.items() if isinstance(current, dict) else enumerate(current) if isinstance(current, list) else ()
        )
        for key, child in list(pairs):
            out.append((current, key))
            stack.append(child)
    return out


def _mutate(node: Any, rng: random.Random) -> None:
    slots = _slots(node)
    if not slots:
        return
    container, key = rng.choice(slots)
    action = rng.random()
    if action < 0.6:
        container[key] = _odd_value(rng)
    elif action < 0.75 and isinstance(container, dict):
        del container[key]
    elif action < 0.85 and isinstance(container, dict):
        container[
            rng.choice(["path", "kind", "dtype", "shape", "xxh3", "impl", "value", "dict", "paths", "kinds", "x"])
        ] = container.pop(key)
    elif isinstance(container, list):
        container.insert(rng.randrange(len(container) + 1), copy.deepcopy(container[key]))
    else:
        container[key] = copy.deepcopy(rng.choice(slots)[0])


def _dump(value: Any, rng: random.Random) -> str:
    text = json.dumps(value, separators=(",", ":"))
    depth = rng.choice([40, 300, 5000, 100_000])
    return (
        text.replace('"@@BIG@@"', "9" * 5000)
        .replace('"@@DEEP@@"', "[" * depth + "]" * depth)
        .replace('"@@HUGEFLOAT@@"', "1e999")
    )


def _as_version_2(manifest: dict[str, Any]) -> dict[str, Any]:
    """A version 3 manifest as version 2 wrote it: one entry per leaf, so that both readers are attacked."""
    checksums = iter(manifest["xxh3"])
    entries = []
    for index, (path, letter) in enumerate(zip(manifest["paths"], manifest["kinds"], strict=True)):
        entry = {"path": path, "kind": KIND_NAMES[letter], **manifest["details"].get(str(index), {})}
        if letter in CHECKSUMMED:
            entry["xxh3"] = next(checksums)
        entries.append(entry)
    columns = ("paths", "kinds", "xxh3", "details")
    return {**{key: value for key, value in manifest.items() if key not in columns}, "version": 2, "leaves": entries}


def fuzzed_headers(trials: int, rng: random.Random, *, time_limit: float = 1.0) -> Result:
    """Headers and manifests changed at random (types, ranges, depth, names, syntax), each with a valid checksum.
    Half the trials start from the manifest as this version writes it (columns), half from a version 2 manifest.

    Every load (half rebuilt from the file, half fitted into the original structure) must end in a jaxstow error or a
    tree, within ``time_limit`` seconds and allocating no more than a small multiple of the file's size (Python
    objects for the parsed JSON; never what a header asks for).
    """
    like = sample_tree()
    tensors, manifest_text, data = split_native(saved_bytes(".jxs", like))
    assert manifest_text is not None
    manifests = [json.loads(manifest_text)]
    manifests.append(_as_version_2(manifests[0]))
    result = Result("fuzzed headers (valid checksums)")
    worst_ratio, worst_peak = 0.0, 0
    # Version 4 on also holds the string metadata as plain header keys, as the writer puts them.
    plains = [plain_metadata(manifest["metadata"]) if manifest["version"] >= 4 else {} for manifest in manifests]
    for manifest, plain in zip(manifests, plains, strict=True):
        original = forge_native(tensors, json.dumps(manifest), data, plain=plain)
        for target in (None, like):  # warm up: jax's caches are filled once, not by a file; both versions load
            jaxstow.load(io.BytesIO(original), target, as_numpy=True)
    tracemalloc.start()
    try:
        for trial in range(trials):
            forged_manifest, forged_tensors = copy.deepcopy(manifests[trial // 2 % 2]), copy.deepcopy(tensors)
            for _ in range(rng.randint(1, 3)):
                _mutate(forged_tensors if rng.random() < 0.2 else forged_manifest, rng)
            text = _dump(forged_manifest, rng)
            if rng.random() < 0.1:  # damaged syntax too
                cut = rng.randrange(len(text))
                text = text[:cut] + rng.choice(["", "]", "}", ",", '"', "\\", "\x00", "[[[["]) + text[cut + 1 :]
            file = forge_native(forged_tensors, text, data, plain=plains[trial // 2 % 2])
            tracemalloc.reset_peak()
            started = time.perf_counter()
            target = like if trial % 2 else None  # rebuilt from the file, or fitted into a structure
            outcome, note = attempt_any(lambda f=file, t=target: jaxstow.load(io.BytesIO(f), t, as_numpy=True))
            elapsed = time.perf_counter() - started
            peak = tracemalloc.get_traced_memory()[1]
            worst_ratio, worst_peak = max(worst_ratio, peak / len(file)), max(worst_peak, peak)
            if elapsed > time_limit:
                outcome, note = "lost", f"took {elapsed:.2f} s"
            elif peak > 64 * len(file) + (4 << 20):
                outcome, note = "lost", f"allocated {peak} bytes for a file of {len(file)}"
            result.add(outcome, note)
    finally:
        tracemalloc.stop()
    result.notes.insert(
        0, f"peak allocation of a load at most {worst_peak >> 10} KiB, {worst_ratio:.0f}x the file's size (parsed JSON)"
    )
    return result
