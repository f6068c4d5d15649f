"""The probes: each runs real faults against real files and counts what jaxstow made of them.

A trial's outcome is *detected* (a jaxstow error, or for a fault of the machine, an error raised by the save),
*harmless* (the data came back identical, or the files are as a correct run leaves them) or *lost* (wrong data, a
builtin exception, a torn file, a temporary file left behind, a load over the time or memory bound). The first few
lost trials are described in ``notes``.

>>> import random
>>> from reliability.probes import flips_native
>>> result = flips_native(20, random.Random(0))
>>> result.trials, result.lost
(20, 0)
"""

from __future__ import annotations

import collections
import contextlib
import copy
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import jaxstow
from jaxstow.errors import JaxstowError
from jaxstow.storage import TEMPORARY_MARKER
from reliability import kill_target
from reliability.forge import forge_native, split_native

__all__ = [
    "Result",
    "disk_full",
    "flips_checkpoint",
    "flips_native",
    "flips_npz",
    "fuzzed_headers",
    "killed_checkpoint_saves",
    "killed_saves",
    "odd_trees",
    "read_only_folders",
    "same",
    "two_writers",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOTES = 5


@dataclass
class Result:
    """The counts of one probe."""

    probe: str
    trials: int = 0
    detected: int = 0
    harmless: int = 0
    lost: int = 0
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    def add(self, outcome: str, note: str = "") -> None:
        self.trials += 1
        setattr(self, outcome, getattr(self, outcome) + 1)
        if outcome == "lost" and len(self.notes) < _NOTES:
            self.notes.append(note)


# -- comparing trees ------------------------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Whether two trees are identical: the same structure and bit-identical leaves of the same types."""
    leaves_a, treedef_a = jax.tree_util.tree_flatten(a)
    leaves_b, treedef_b = jax.tree_util.tree_flatten(b)
    return treedef_a == treedef_b and all(_same_leaf(x, y) for x, y in zip(leaves_a, leaves_b, strict=True))


def _same_leaf(x: Any, y: Any) -> bool:
    if type(x) is not type(y):
        return False
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(x)) == str(jax.random.key_impl(y)) and same(
            jax.random.key_data(x), jax.random.key_data(y)
        )
    if isinstance(x, np.ndarray | np.generic | jax.Array):
        return x.dtype == y.dtype and np.shape(x) == np.shape(y) and np.asarray(x).tobytes() == np.asarray(y).tobytes()
    if isinstance(x, float | complex):
        return repr(x) == repr(y)  # NaN equals NaN, -0.0 differs from 0.0
    return bool(x == y)


def sample_tree() -> dict[str, Any]:
    """A small tree with every kind of leaf: an equinox model, scalars, a string, a PRNG key, odd dtypes."""
    return {
        "model": eqx.nn.MLP(3, 2, 4, 2, activation=jax.nn.gelu, key=jax.random.key(0)),
        "step": 7,
        "lr": 0.125,
        "name": "run-1",
        "key": jax.random.key(3),
        "half": np.arange(6).astype(ml_dtypes.bfloat16),
        "flags": np.array([True, False, True]),
        "scale": np.float32(2.5),
    }


def _attempt(load: Callable[[], Any], reference: Any) -> tuple[str, str]:
    try:
        value = load()
    except JaxstowError:
        return "detected", ""
    except Exception as error:
        return "lost", f"{type(error).__name__}: {str(error)[:160]}"
    return ("harmless", "") if same(value, reference) else ("lost", "wrong data returned without an error")


def _flip(data: bytes, position: int, bit: int) -> bytes:
    flipped = bytearray(data)
    flipped[position] ^= 1 << bit
    return bytes(flipped)


def _native_position(data: bytes, rng: random.Random) -> int:
    """A byte of a native file: the length, the header text, its padding or the data, weighted towards the header."""
    (length,) = np.frombuffer(data[:8], "<u8")
    text_end = 8 + len(data[8 : 8 + int(length)].rstrip(b" "))
    regions = [(0, 8, 1), (8, text_end, 5), (text_end, 8 + int(length), 1), (8 + int(length), len(data), 3)]
    regions = [region for region in regions if region[1] > region[0]]
    start, end, _ = rng.choices(regions, weights=[weight for _, _, weight in regions])[0]
    return rng.randrange(start, end)


# -- byte flips -----------------------------------------------------------------------------------------------------


def _saved_bytes(suffix: str, tree: Any) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"model{suffix}")
        jaxstow.save(path, tree, metadata={"epoch": 2, "note": "flips"})
        with open(path, "rb") as file:
            return file.read()


def _flips(probe: str, suffix: str, trials: int, rng: random.Random) -> Result:
    original = _saved_bytes(suffix, sample_tree())
    reference = jaxstow.load(io.BytesIO(original), as_numpy=True)
    result = Result(probe)
    for _ in range(trials):
        position = _native_position(original, rng) if suffix == ".jxs" else rng.randrange(len(original))
        damaged = _flip(original, position, rng.randrange(8))
        outcome, note = _attempt(lambda data=damaged: jaxstow.load(io.BytesIO(data), as_numpy=True), reference)
        result.add(outcome, f"byte {position}: {note}")
    return result


def flips_native(trials: int, rng: random.Random) -> Result:
    """One flipped bit per trial in a native ``.jxs`` file (header, padding, length or data); then a load."""
    return _flips("bit flips in .jxs", ".jxs", trials, rng)


def flips_npz(trials: int, rng: random.Random) -> Result:
    """One flipped bit per trial anywhere in a jaxstow ``.npz`` archive; then a load."""
    return _flips("bit flips in .npz", ".npz", trials, rng)


def flips_checkpoint(trials: int, rng: random.Random) -> Result:
    """One flipped bit per trial in a step folder (its ``checkpoint.json`` or an item file); then a restore."""
    result = Result("bit flips in checkpoint folders")
    with tempfile.TemporaryDirectory() as root:
        items = {"params": sample_tree(), "opt": {"count": np.int32(4), "mu": np.ones(3, np.float32)}}
        with jaxstow.CheckpointManager(root) as manager:
            manager.save(5, items, metrics={"loss": 0.125}, metadata={"epoch": 2})

        def restore() -> Any:
            reader = jaxstow.CheckpointManager(root)
            return reader.restore(5, as_numpy=True), reader.metrics(5), reader.metadata(5), reader.steps()

        reference = restore()
        folder = os.path.join(root, "5")
        names = sorted(os.listdir(folder))
        originals = {name: open(os.path.join(folder, name), "rb").read() for name in names}  # noqa: SIM115
        for _ in range(trials):
            name = "checkpoint.json" if rng.random() < 0.4 else rng.choice(names)
            data = originals[name]
            position = rng.randrange(len(data)) if name.endswith(".json") else _native_position(data, rng)
            with open(os.path.join(folder, name), "wb") as file:
                file.write(_flip(data, position, rng.randrange(8)))
            outcome, note = _attempt(restore, reference)
            result.add(outcome, f"{name} byte {position}: {note}")
            with open(os.path.join(folder, name), "wb") as file:
                file.write(data)
    return result


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
        outcome, note = _attempt(lambda source=sink: jaxstow.load(source, as_numpy=True), tree)
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
    "threefry2x32", "value", "array", "key", [], {}, [1, 2], [-1], [0, -5], [[]], {"dict": 5}, {"dict": [1, 2]},
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
        container[rng.choice(["path", "kind", "dtype", "shape", "xxh3", "impl", "value", "dict", "x"])] = container.pop(
            key
        )
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


def fuzzed_headers(trials: int, rng: random.Random, *, time_limit: float = 1.0) -> Result:
    """Headers and manifests changed at random (types, ranges, depth, names, syntax), each with a valid checksum.

    Every load (half rebuilt from the file, half fitted into the original structure) must end in a jaxstow error or a
    tree, within ``time_limit`` seconds and allocating no more than a small multiple of the file's size (Python
    objects for the parsed JSON; never what a header asks for).
    """
    like = sample_tree()
    tensors, manifest_text, data = split_native(_saved_bytes(".jxs", like))
    assert manifest_text is not None
    manifest = json.loads(manifest_text)
    result = Result("fuzzed headers (valid checksums)")
    worst_ratio, worst_peak = 0.0, 0
    tracemalloc.start()
    try:
        for trial in range(trials):
            forged_manifest, forged_tensors = copy.deepcopy(manifest), copy.deepcopy(tensors)
            for _ in range(rng.randint(1, 3)):
                _mutate(forged_tensors if rng.random() < 0.2 else forged_manifest, rng)
            text = _dump(forged_manifest, rng)
            if rng.random() < 0.1:  # damaged syntax too
                cut = rng.randrange(len(text))
                text = text[:cut] + rng.choice(["", "]", "}", ",", '"', "\\", "\x00", "[[[["]) + text[cut + 1 :]
            file = forge_native(forged_tensors, text, data)
            tracemalloc.reset_peak()
            started = time.perf_counter()
            target = like if trial % 2 else None  # rebuilt from the file, or fitted into a structure
            outcome, note = _attempt_any(lambda f=file, t=target: jaxstow.load(io.BytesIO(f), t, as_numpy=True))
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


def _attempt_any(load: Callable[[], Any]) -> tuple[str, str]:
    """A forged file has no true content: a tree is as good an answer as a jaxstow error; anything else is lost."""
    try:
        load()
    except JaxstowError:
        return "detected", ""
    except Exception as error:
        return "lost", f"{type(error).__name__}: {str(error)[:160]}"
    return "harmless", ""


# -- killed and concurrent writers ----------------------------------------------------------------------------------


class _Forker:
    """The writer factory of :mod:`reliability.kill_target`, in its own process."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "reliability.kill_target"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, command: str) -> str:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self._process.stdout.readline().strip()

    def kill_after(self, command: str, delay: float) -> None:
        pid = int(self.ask(command))
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        assert self._process.stdout is not None
        self._process.stdout.readline()  # "reaped"

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait()


@contextlib.contextmanager
def _forker() -> Iterator[_Forker]:
    forker = _Forker()
    try:
        yield forker
    finally:
        forker.close()


def _temporaries(folder: str) -> list[str]:
    return [name for name in os.listdir(folder) if TEMPORARY_MARKER in name]


def killed_saves(trials: int, rng: random.Random) -> Result:
    """``jaxstow.save`` SIGKILLed at a random moment, over and over; the file must be whole, old or new, and the next
    save must leave no temporary file."""
    result = Result("SIGKILL during jaxstow.save")
    with tempfile.TemporaryDirectory() as folder, _forker() as forker:
        path = os.path.join(folder, "model.jxs")
        version = 0
        left = 0
        for _ in range(trials):
            forker.kill_after(f"save {path} {version + 1}", rng.uniform(0.0, 0.3))
            problems = []
            if os.path.exists(path):
                restored = jaxstow.load(path, as_numpy=True)
                if not kill_target.is_whole(restored):
                    problems.append("torn file")
                version = max(version, restored["version"])
            left += len(_temporaries(folder))
            version += 1
            jaxstow.save(path, kill_target.tree(version))
            if _temporaries(folder):
                problems.append(f"temporary files left after the next save: {_temporaries(folder)}")
            result.add("lost" if problems else "harmless", "; ".join(problems))
    result.notes.insert(0, f"{left} temporary files found after kills, all removed by the next save")
    return result


def killed_checkpoint_saves(trials: int, rng: random.Random) -> Result:
    """``CheckpointManager.save`` SIGKILLed at a random moment; every listed step must restore whole, none may be
    damaged, and the next manager's save must leave no temporary folder."""
    result = Result("SIGKILL during CheckpointManager.save")
    left = 0
    with tempfile.TemporaryDirectory() as root, _forker() as forker:
        step = 0
        for _ in range(trials):
            forker.kill_after(f"ckpt {root} {step + 1}", rng.uniform(0.0, 0.4))
            problems = []
            reader = jaxstow.CheckpointManager(root)
            if reader.damaged_steps():
                problems.append(f"damaged steps: {reader.damaged_steps()}")
            for committed in reader.steps():
                if not kill_target.is_whole(reader.restore(committed, as_numpy=True)["params"]):
                    problems.append(f"step {committed} is torn")
            step = max([step, *reader.steps()]) + 1
            left += len(_temporaries(root))
            with jaxstow.CheckpointManager(root, keep_last=2) as manager:
                manager.save(step, {"params": kill_target.tree(step)})
            if _temporaries(root):
                problems.append(f"temporary entries left after the next save: {_temporaries(root)}")
            result.add("lost" if problems else "harmless", "; ".join(problems))
    result.notes.insert(0, f"{left} unfinished steps found after kills, all removed by the next manager")
    return result


def two_writers(trials: int, rng: random.Random) -> Result:
    """Two processes saving the same file at once while it is read; a second checkpoint manager on a directory.

    Each trial is one load during the race (it must be a whole version) or one attempt of a second manager (it must
    be refused).
    """
    del rng
    result = Result("two writers")
    with tempfile.TemporaryDirectory() as folder, _forker() as forker:
        path = os.path.join(folder, "model.jxs")
        jaxstow.save(path, kill_target.tree(0))
        # the forker answers once both writers are done; meanwhile this thread reads the file
        thread = threading.Thread(target=forker.ask, args=(f"race {path} 1 {max(trials // 2, 2)}",))
        thread.start()
        while thread.is_alive() and result.trials < trials - 1:
            outcome, note = _attempt(lambda: kill_target.is_whole(jaxstow.load(path, as_numpy=True)), True)
            result.add(outcome, note)
        thread.join()
        leftovers = _temporaries(folder)
        result.add("lost" if leftovers else "harmless", f"temporary files left by finished saves: {leftovers}")
        with jaxstow.CheckpointManager(os.path.join(folder, "run")) as manager:
            manager.save(0, {"params": kill_target.tree(0)})
            manager.wait()
            answer = forker.ask(f"lock {os.path.join(folder, 'run')}")
        result.add("detected" if answer == "refused" else "lost", f"a second manager was {answer}")
    return result


# -- full disks and read-only folders -------------------------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(size: str) -> Iterator[str | None]:
    """A fresh tmpfs of ``size`` (when this process may mount one), else ``None``."""
    folder = tempfile.mkdtemp()
    mounted = (
        os.geteuid() == 0
        and shutil.which("mount") is not None
        and (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder], capture_output=True
            ).returncode
            == 0
        )
    )
    try:
        yield folder if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", folder], check=True)
        os.rmdir(folder)


def disk_full(trials: int, rng: random.Random) -> Result:
    """Saves (native, npz, checkpoint steps) that run out of space on a small tmpfs; the previous file or step must
    stay whole and no temporary file may remain."""
    result = Result("disk full (8 MiB tmpfs)")
    with _tmpfs("8m") as folder:
        if folder is None:
            result.skipped = "needs root and mount to make a small tmpfs"
            return result
        small = {"w": np.arange(1000, dtype=np.float32)}
        for trial in range(trials):
            kind = ("model.jxs", "model.npz", "checkpoint")[trial % 3]
            big = {"w": np.full(rng.randint(3, 12) << 20, trial, np.float32)}  # 12 to 48 MiB: never fits
            problems = []
            try:
                if kind == "checkpoint":
                    root = os.path.join(folder, "run")
                    with jaxstow.CheckpointManager(root) as manager:
                        if not manager.steps():
                            manager.save(0, small)
                            manager.wait()
                        manager.save(max(manager.steps()) + 1, big)
                else:
                    path = os.path.join(folder, kind)
                    if not os.path.exists(path):
                        jaxstow.save(path, small)
                    jaxstow.save(path, big)
            except (OSError, JaxstowError):
                outcome = "detected"
            else:
                outcome, problems = "lost", ["a save that cannot fit reported success"]
            if kind == "checkpoint":
                reader = jaxstow.CheckpointManager(os.path.join(folder, "run"))
                if reader.damaged_steps() or not same(reader.restore(0, as_numpy=True), small):
                    problems.append("the previous step was harmed")
            elif not same(jaxstow.load(os.path.join(folder, kind), as_numpy=True), small):
                problems.append("the previous file was harmed")
            leftovers = _temporaries(folder) + _temporaries(os.path.join(folder, "run")) if kind == "checkpoint" else []
            leftovers += _temporaries(folder)
            if leftovers:
                problems.append(f"temporary files left: {sorted(set(leftovers))}")
            result.add("lost" if problems else outcome, "; ".join(problems))
    return result


@contextlib.contextmanager
def _read_only_folder() -> Iterator[tuple[str | None, Callable[[], None]]]:
    """A folder and a function that makes it read-only: a tmpfs remounted read-only when this process may mount one,
    else a folder whose mode forbids writing (which binds every user but root); ``None`` if neither works."""
    with _tmpfs("16m") as mounted:
        if mounted is not None:
            yield mounted, lambda: subprocess.run(["mount", "-o", "remount,ro", mounted], check=True)
            return
        if os.geteuid() == 0:
            yield None, lambda: None
            return
        folder = tempfile.mkdtemp()

        def protect() -> None:
            for path, _, _ in os.walk(folder):
                os.chmod(path, 0o555)

        try:
            yield folder, protect
        finally:
            for path, _, _ in os.walk(folder):
                os.chmod(path, 0o755)
            shutil.rmtree(folder)


def read_only_folders(trials: int, rng: random.Random) -> Result:
    """A folder that cannot be written: saves must fail cleanly and leave no file, loads and restores must work."""
    del rng
    result = Result("read-only folders")
    with _read_only_folder() as (folder, protect):
        if folder is None:
            result.skipped = "as root, needs mount for a read-only tmpfs (file modes do not stop root)"
            return result
        small = {"w": np.arange(10, dtype=np.float32)}
        for name in ("model.jxs", "model.npz"):
            jaxstow.save(os.path.join(folder, name), small)
        with jaxstow.CheckpointManager(os.path.join(folder, "run")) as manager:
            manager.save(0, small)
        protect()
        for trial in range(trials):
            kind = ("model.jxs", "model.npz", "checkpoint")[trial % 3]
            try:
                if kind == "checkpoint":
                    with jaxstow.CheckpointManager(os.path.join(folder, "run")) as manager:
                        manager.save(trial + 1, small)
                else:
                    jaxstow.save(os.path.join(folder, kind), {"w": np.zeros(3)})
            except (OSError, JaxstowError):
                outcome, note = "detected", ""
            else:
                outcome, note = "lost", "a save into a read-only folder reported success"
            if kind == "checkpoint":
                restored = jaxstow.CheckpointManager(os.path.join(folder, "run")).restore(as_numpy=True)
            else:
                restored = jaxstow.load(os.path.join(folder, kind), as_numpy=True)
            if not same(restored, small):
                outcome, note = "lost", "the saved data cannot be read back unchanged"
            result.add(outcome, note)
    return result
