"""Issue 2 benchmark: jaxstow against its peers and the raw limit, saving and restoring trees T1 and T2.

Run from the repository root: ``python bench/bench_core.py`` (``--trees T2`` or ``--methods jaxstow raw`` for part of it).

Each (tree, method) pair runs in a fresh subprocess, so that one method's caches, threads and allocator state never
touch another's. The subprocess builds the tree as ``jax.Array`` leaves, saves it several times (each run to a fresh
name; every save ends durable: jaxstow fsyncs itself, every peer gets an fsync of each file it wrote and of the
folders), reads the result once to warm the page cache, then restores it several times to numpy and to jax arrays
(``block_until_ready``). Restores are warm-cache for every method alike: dropping the page cache needs root.

What each method is given and returns is what a user would write: peers that store flat name -> array maps are given
``np.asarray`` of each leaf under its ``a/b/c`` path (zero-copy on CPU; counted in the save) and return their flat map;
jaxstow returns the nested tree. The raw limit writes every leaf with ``ndarray.tofile`` into one file and reads it back
with ``readinto`` into arrays allocated before the clock starts (to jax: 64-byte-aligned arrays, then ``device_put``,
which adopts them without a copy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import numpy as np
from timing import format_table, fsync_path, measure, median, remove, warm_cache
from trees import make_t1, make_t2

import jaxstow

Tree = Any
Thunk = Callable[[], Any]
# A restore is prepared outside the clock (given the file and a tree like the saved one) and returns the timed call.
Restore = Callable[[str, Tree], Thunk]

TREES: dict[str, Callable[[], Tree]] = {"T1": make_t1, "T2": make_t2}
RUNS = {"T1": 3, "T2": 5}
BUDGET_SECONDS = {"T1": 20.0, "T2": 10.0}  # once one operation has taken this long in all, no more runs of it
SAVE_HEADROOM_MIB = 64
MIB = 1 << 20


@dataclass(frozen=True)
class Method:
    name: str
    save: Callable[[str, Tree], None]
    to_numpy: Restore
    to_jax: Restore


def flat_numpy(tree: Tree) -> dict[str, np.ndarray]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(leaf) for path, leaf in leaves}


def ready(tree: Tree) -> Tree:
    return jax.block_until_ready(tree)


def durable(write: Callable[[str, Tree], None]) -> Callable[[str, Tree], None]:
    """``write`` followed by an fsync of everything it wrote and of the folders, for peers that do not fsync."""

    def save(path: str, tree: Tree) -> None:
        write(path, tree)
        fsync_path(path)

    return save


def simple(read: Callable[[str, Tree], Any]) -> Restore:
    return lambda path, like: lambda: read(path, like)


def to_device(read: Callable[[str, Tree], Any]) -> Restore:
    """A restore to jax arrays for a peer that reads numpy: its numpy result, put on the device."""
    return simple(lambda path, like: ready(jax.device_put(read(path, like))))


# -- the raw limit


def raw_write(path: str, tree: Tree) -> None:
    with open(path, "wb") as file:
        for leaf in jax.tree.leaves(tree):
            np.asarray(leaf).tofile(file)


def _read_into(path: str, arrays: list[np.ndarray]) -> None:
    with open(path, "rb", buffering=0) as file:
        for array in arrays:
            file.readinto(memoryview(array.reshape(-1).view(np.uint8)))


def raw_to_numpy(path: str, like: Tree) -> Thunk:
    arrays = [np.empty(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(like)]

    def run() -> list[np.ndarray]:
        _read_into(path, arrays)
        return arrays

    return run


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def raw_to_jax(path: str, like: Tree) -> Thunk:
    arrays = [_aligned_empty(leaf.shape, np.dtype(leaf.dtype)) for leaf in jax.tree.leaves(like)]

    def run() -> list[jax.Array]:
        _read_into(path, arrays)
        return ready(jax.device_put(arrays))

    return run


# -- the peers


def savez_write(path: str, tree: Tree) -> None:
    with open(path, "wb") as file:
        np.savez(file, **flat_numpy(tree))


def savez_read(path: str, like: Tree) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def safetensors_write(path: str, tree: Tree) -> None:
    import safetensors.numpy

    safetensors.numpy.save_file(flat_numpy(tree), path)


def safetensors_read(path: str, like: Tree) -> dict[str, np.ndarray]:
    import safetensors.numpy

    return safetensors.numpy.load_file(path)


def safetensors_read_flax(path: str, like: Tree) -> dict[str, jax.Array]:
    import safetensors.flax

    return ready(safetensors.flax.load_file(path))


def equinox_write(path: str, tree: Tree) -> None:
    import equinox as eqx

    with open(path, "wb") as file:
        eqx.tree_serialise_leaves(file, tree)


def equinox_read(path: str, like: Tree) -> Tree:
    """To the leaf types of ``like``: numpy for numpy leaves, ``jax.Array`` for jax ones."""
    import equinox as eqx

    with open(path, "rb") as file:
        return ready(eqx.tree_deserialise_leaves(file, like))


def msgpack_write(path: str, tree: Tree) -> None:
    from flax import serialization

    Path(path).write_bytes(serialization.msgpack_serialize(tree))


def msgpack_read(path: str, like: Tree) -> Tree:
    from flax import serialization

    return serialization.msgpack_restore(Path(path).read_bytes())


def _orbax() -> Any:
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def orbax_write(path: str, tree: Tree) -> None:
    checkpointer = _orbax()
    checkpointer.save(os.path.abspath(path), tree)
    checkpointer.wait_until_finished()


def orbax_to_numpy(path: str, like: Tree) -> Thunk:
    """Restored into numpy by a numpy target; without one orbax returns jax arrays."""
    checkpointer = _orbax()
    return lambda: checkpointer.restore(os.path.abspath(path), like)


def orbax_to_jax(path: str, like: Tree) -> Thunk:
    checkpointer = _orbax()
    return lambda: ready(checkpointer.restore(os.path.abspath(path)))


def h5py_write(path: str, tree: Tree) -> None:
    import h5py

    with h5py.File(path, "w") as file:
        for name, array in flat_numpy(tree).items():
            file.create_dataset(name, data=array)


def h5py_read(path: str, like: Tree) -> dict[str, np.ndarray]:
    import h5py

    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as file:
        file.visititems(lambda name, node: out.update({name: node[()]}) if isinstance(node, h5py.Dataset) else None)
    return out


def jaxstow_write(path: str, tree: Tree) -> None:
    jaxstow.save(path, tree)


METHODS = {
    method.name: method
    for method in (
        Method("raw limit", durable(raw_write), raw_to_numpy, raw_to_jax),
        Method("jaxstow", jaxstow_write, simple(lambda p, _: jaxstow.load(p, as_numpy=True)),
               simple(lambda p, _: ready(jaxstow.load(p)))),
        Method("safetensors", durable(safetensors_write), simple(safetensors_read), simple(safetensors_read_flax)),
        Method("np.savez", durable(savez_write), simple(savez_read), to_device(savez_read)),
        Method("equinox", durable(equinox_write), simple(equinox_read), simple(equinox_read)),
        Method("flax msgpack", durable(msgpack_write), simple(msgpack_read), to_device(msgpack_read)),
        Method("orbax", durable(orbax_write), orbax_to_numpy, orbax_to_jax),
        Method("h5py", durable(h5py_write), simple(h5py_read), to_device(h5py_read)),
    )
}
OPERATIONS = ("save", "numpy", "jax")


# -- one (tree, method) pair, in its own process


def fingerprint(tree: Tree) -> tuple[int, int, float]:
    """Leaf count, bytes, and the sum of each leaf's first values: enough to catch a restore of the wrong data."""
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]
    head = sum(float(leaf.reshape(-1)[:1024].sum(dtype=np.float64)) for leaf in leaves)
    return len(leaves), sum(leaf.nbytes for leaf in leaves), head


def check_restored(expected: tuple[int, int, float], leaf_type: type) -> Callable[[Any], None]:
    def check(restored: Any) -> None:
        count, nbytes, total = fingerprint(restored)
        wrong_type = {type(leaf).__name__ for leaf in jax.tree.leaves(restored) if not isinstance(leaf, leaf_type)}
        if (count, nbytes) != expected[:2] or not np.isclose(total, expected[2], rtol=1e-9) or wrong_type:
            raise AssertionError(f"restored {count} leaves, {nbytes} bytes, sum {total}, types {wrong_type or 'ok'}; "
                                 f"expected {expected}")

    return check


def repeat(run: Callable[[], tuple[float, int]], runs: int, budget: float) -> dict[str, Any]:
    seconds: list[float] = []
    peaks: list[int] = []
    while len(seconds) < runs and sum(seconds) < budget:
        elapsed, peak = run()
        seconds.append(elapsed)
        peaks.append(peak)
    return {"seconds": seconds, "peak": max(peaks)}


def restore_once(restore: Restore, target: str, like: Tree, check: Callable[[Any], None]) -> Callable[[], tuple[float, int]]:
    return lambda: measure(restore(target, like), inspect=check)


def run_pair(tree_name: str, method: Method, folder: Path) -> dict[str, Any]:
    tree = TREES[tree_name]()
    like_numpy = jax.tree.map(np.asarray, tree)
    expected = fingerprint(tree)
    runs, budget = RUNS[tree_name], BUDGET_SECONDS[tree_name]
    target = str(folder / f"{tree_name}-{method.name.replace(' ', '-')}")

    def save_once() -> tuple[float, int]:
        remove(target)
        return measure(lambda: method.save(target, tree))

    results = {"bytes": expected[1], "save": repeat(save_once, runs, budget)}
    warm_cache(target)
    for operation, restore, like, leaf_type in (
        ("numpy", method.to_numpy, like_numpy, np.ndarray),
        ("jax", method.to_jax, tree, jax.Array),
    ):
        results[operation] = repeat(restore_once(restore, target, like, check_restored(expected, leaf_type)), runs, budget)
    remove(target)
    return results


# -- the whole benchmark


def run_in_subprocess(tree_name: str, method_name: str, folder: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--pair", tree_name, method_name, str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        return {"error": lines[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def speed(result: dict[str, Any], operation: str) -> float:
    """GB/s of the median run."""
    return float(result["bytes"]) / median(result[operation]["seconds"]) / 1e9


TITLES = {
    "save": "save",
    "numpy": "restore to numpy",
    "jax": "restore to jax arrays (x limit: to the raw limit to numpy)",
}


def table(results: dict[str, dict[str, Any]], operation: str) -> str:
    limit = speed(results["raw limit"], "numpy" if operation == "jax" else operation)
    orbax = speed(results["orbax"], operation)
    rows = []
    for name, result in results.items():
        if "error" in result:
            rows.append([name, "-", "-", "-", "-", "-", "-", f"failed: {result['error']}"])
            continue
        measured = result[operation]
        gbps = speed(result, operation)
        rows.append([
            name, str(len(measured["seconds"])), f"{median(measured['seconds']):.3f}", f"{gbps:.2f}",
            f"{gbps / limit:.2f}", f"{gbps / orbax:.1f}", f"{measured['peak'] / MIB:.0f}", "",
        ])
    headers = ["method", "runs", "median s", "GB/s", "x limit", "x orbax", "peak MiB", ""]
    return format_table(headers, rows)


def targets(results: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[bool, str]]:
    checks: list[tuple[bool, str]] = []

    def seconds(tree: str, method: str, operation: str) -> float:
        return median(results[tree][method][operation]["seconds"])

    if "T1" in results:
        t1 = results["T1"]
        for operation, other, factor, label in (
            ("save", "raw limit", 0.9, "T1 save >= 0.9x raw limit"),
            ("save", "orbax", 3.0, "T1 save >= 3x orbax"),
            ("numpy", "raw limit", 0.9, "T1 restore to numpy >= 0.9x raw limit"),
        ):
            ratio = speed(t1["jaxstow"], operation) / speed(t1[other], operation)
            checks.append((ratio >= factor, f"{label}: {ratio:.2f}x"))
        ratio = speed(t1["jaxstow"], "jax") / speed(t1["raw limit"], "numpy")
        checks.append((ratio >= 0.9, f"T1 restore to jax >= 0.9x raw limit to numpy: {ratio:.2f}x"))
    if "T2" in results:
        for operation in OPERATIONS:
            ours = seconds("T2", "jaxstow", operation)
            peer, orbax = seconds("T2", "safetensors", operation), seconds("T2", "orbax", operation)
            checks.append((ours <= peer, f"T2 {TITLES[operation].split(' (')[0]} no slower than safetensors: "
                                         f"{ours:.3f} s vs {peer:.3f} s"))
            checks.append((orbax / ours >= 200, f"T2 {TITLES[operation].split(' (')[0]} >= 200x orbax: "
                                                f"{orbax / ours:.0f}x ({orbax:.2f} s)"))
    for tree, tree_results in results.items():
        peak = tree_results["jaxstow"]["save"]["peak"] / MIB
        checks.append((peak <= SAVE_HEADROOM_MIB, f"{tree} save peak memory <= {SAVE_HEADROOM_MIB} MiB beyond the "
                                                  f"tree: {peak:.0f} MiB"))
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", choices=list(TREES), default=list(TREES))
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--pair", nargs=3, metavar=("TREE", "METHOD", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pair:
        tree_name, method_name, folder = args.pair
        print(json.dumps(run_pair(tree_name, METHODS[method_name], Path(folder))))
        return
    methods = sorted(set(args.methods) | {"raw limit", "jaxstow", "orbax"}, key=list(METHODS).index)
    started = time.perf_counter()
    print(f"jaxstow benchmark: jax {jax.__version__}, numpy {np.__version__}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("Restores are warm-cache for every method (each file is read once before its restores; dropping the page "
          "cache needs root).")
    print("peak MiB: the largest growth of resident memory during one run (kernel high-water mark); a restore's "
          "includes the restored tree.")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="jaxstow-bench-", dir="/tmp") as folder:
        for tree_name in args.trees:
            results[tree_name] = {name: run_in_subprocess(tree_name, name, Path(folder)) for name in methods}
            nbytes = next(r["bytes"] for r in results[tree_name].values() if "bytes" in r)
            for operation in OPERATIONS:
                print(f"\n{tree_name} ({nbytes / 1e9:.3f} GB), {TITLES[operation]}")
                print(table(results[tree_name], operation))
    print("\nTargets")
    for passed, line in targets(results):
        print(f"{'PASS' if passed else 'FAIL'}  {line}")
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
