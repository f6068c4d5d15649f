"""Core benchmark: jaxstow against its peers and the raw limit, saving and restoring trees T1 and T2.

Run from the repository root: ``python bench/bench_core.py`` (``--trees T2``, ``--methods h5py``: part of it;
the raw limit, jaxstow, safetensors and orbax always run, as the targets need them).

Each method runs in a worker process of its own, so that one method's caches, threads and allocator state never touch
another's. The workers build the tree as ``jax.Array`` leaves, then run in rounds, every method once a round, so that a
change in the load of this shared machine falls on all of them alike. In its turn a method saves (to a fresh name;
every save ends durable: jaxstow fsyncs itself, every peer gets an fsync of each file it wrote and of the folders),
reads the file once to warm the page cache, and restores it to numpy, then to jax arrays (``block_until_ready``).
Restores are warm-cache for every method alike: dropping the page cache needs root.

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
from timing import Sample, format_table, fsync_path, measure, median, remove, warm_cache
from trees import make_t1, make_t2

import jaxstow

Tree = Any
Thunk = Callable[[], Any]
# A restore is prepared outside the clock (given the file and a tree like the saved one) and returns the timed call.
Restore = Callable[[str, Tree], Thunk]

TREES: dict[str, Callable[[], Tree]] = {"T1": make_t1, "T2": make_t2}
RUNS = {"T1": 3, "T2": 5}
BUDGET_SECONDS = {"T1": 45.0, "T2": 20.0}  # once a method's rounds have taken this long, it runs no more
SAVE_HEADROOM_MIB = 64
MIB = 1 << 20
WARM_MARGIN_BYTES = 256 * MIB  # each run starts with twice the tree and this much memory freshly touched


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
        Method(
            "jaxstow",
            jaxstow_write,
            simple(lambda p, _: jaxstow.load(p, as_numpy=True)),
            simple(lambda p, _: ready(jaxstow.load(p))),
        ),
        Method("safetensors", durable(safetensors_write), simple(safetensors_read), simple(safetensors_read_flax)),
        Method("np.savez", durable(savez_write), simple(savez_read), to_device(savez_read)),
        Method("equinox", durable(equinox_write), simple(equinox_read), simple(equinox_read)),
        Method("flax msgpack", durable(msgpack_write), simple(msgpack_read), to_device(msgpack_read)),
        Method("orbax", durable(orbax_write), orbax_to_numpy, orbax_to_jax),
        Method("h5py", durable(h5py_write), simple(h5py_read), to_device(h5py_read)),
    )
}
OPERATIONS = ("save", "numpy", "jax")


# -- one method on one tree, in its own process


def fingerprint(tree: Tree) -> tuple[int, int, float]:
    """Leaf count, bytes, and the sum of each leaf's first values: enough to catch a restore of the wrong data."""
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]
    head = sum(float(leaf.reshape(-1)[:1024].sum(dtype=np.float64)) for leaf in leaves)
    return len(leaves), sum(leaf.nbytes for leaf in leaves), head


class Runner:
    """Holds one tree and runs one method's save and restores on it, one run per call."""

    def __init__(self, tree_name: str, method: Method, folder: Path) -> None:
        self.method = method
        self.tree: Tree = TREES[tree_name]()
        self.expected = fingerprint(self.tree)
        self.likes = {"numpy": jax.tree.map(np.asarray, self.tree), "jax": self.tree}
        self.target = str(folder / f"{tree_name}-{method.name.replace(' ', '-')}")
        self.warm_bytes = 2 * self.expected[1] + WARM_MARGIN_BYTES

    def run(self, command: str) -> dict[str, Any]:
        """Run one command: ``save``, ``warm`` (read the file once), ``numpy``, ``jax`` (restores) or ``remove``."""
        if command == "warm":
            warm_cache(self.target)
        elif command == "remove":
            remove(self.target)
        else:
            return (self.save() if command == "save" else self.restore(command))._asdict()
        return {}

    def save(self) -> Sample:
        remove(self.target)
        return measure(lambda: self.method.save(self.target, self.tree), warm_bytes=self.warm_bytes)

    def restore(self, operation: str) -> Sample:
        restore = self.method.to_numpy if operation == "numpy" else self.method.to_jax
        thunk = restore(self.target, self.likes[operation])
        return measure(thunk, inspect=self._checker(operation), warm_bytes=self.warm_bytes)

    def _checker(self, operation: str) -> Callable[[Any], None]:
        leaf_type = np.ndarray if operation == "numpy" else jax.Array

        def check(restored: Any) -> None:
            found = fingerprint(restored)
            wrong_types = {type(leaf).__name__ for leaf in jax.tree.leaves(restored) if not isinstance(leaf, leaf_type)}
            if found[:2] != self.expected[:2] or not np.isclose(found[2], self.expected[2], rtol=1e-9) or wrong_types:
                raise AssertionError(
                    f"restored (leaves, bytes, head sum) {found} with leaf types {wrong_types or 'ok'}, "
                    f"saved {self.expected}"
                )

        return check


def serve(tree_name: str, method: Method, folder: Path) -> None:
    """The worker process: one JSON line on stdout for each command on stdin (save, warm, numpy, jax, remove)."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # whatever a library prints goes to stderr, not into the replies

    def reply(fields: dict[str, Any]) -> None:
        replies.write(json.dumps(fields) + "\n")
        replies.flush()

    runner = Runner(tree_name, method, folder)
    reply({"bytes": runner.expected[1]})
    try:
        for line in sys.stdin:
            reply(runner.run(line.strip()))
    except Exception as error:
        reply({"error": f"{type(error).__name__}: {error}"})
        raise
    finally:
        runner.run("remove")


class Worker:
    """The parent's handle on a worker process."""

    def __init__(self, tree_name: str, method_name: str, folder: Path) -> None:
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in close()
        command = [sys.executable, __file__, "--serve", tree_name, method_name, str(folder)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )

    def ask(self, command: str | None = None) -> dict[str, Any]:
        """Send a command (none: wait for the worker to be ready) and return its reply."""
        assert self.process.stdin is not None and self.process.stdout is not None
        if command is not None:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        if line:
            reply: dict[str, Any] = json.loads(line)
            return reply
        self.process.wait()
        self.log.seek(0)
        lines = self.log.read().strip().splitlines() or [f"exit code {self.process.returncode}"]
        return {"error": lines[-1]}

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait()
        self.log.close()


# -- the whole benchmark


def run_tree(tree_name: str, names: list[str], folder: Path) -> dict[str, dict[str, Any]]:
    """Every method's runs on one tree, in rounds, so that a change in the load of the machine falls on all methods
    alike. In a round each method saves, reads its file once to warm the page cache, and restores it to numpy and to
    jax arrays; only one method's file is cached at a time, so the kernel's reclaim of idle page cache (DAMON here)
    cannot cool it. A method stops once its rounds have taken the budget."""
    workers = {name: Worker(tree_name, name, folder) for name in names}
    results = {name: worker.ask() for name, worker in workers.items()}
    samples: dict[str, dict[str, list[dict[str, float]]]] = {name: {op: [] for op in OPERATIONS} for name in names}
    try:
        for _ in range(RUNS[tree_name]):
            for name in names:
                spent = sum(sample["seconds"] for runs in samples[name].values() for sample in runs)
                if "error" in results[name] or spent >= BUDGET_SECONDS[tree_name]:
                    continue
                for command in ("save", "warm", "numpy", "jax", "remove"):
                    reply = workers[name].ask(command)
                    if "error" in reply:
                        results[name] = reply
                        break
                    if command in OPERATIONS:
                        samples[name][command].append(reply)
    finally:
        for worker in workers.values():
            worker.close()
    for name in names:
        if "error" not in results[name]:
            results[name].update(
                {
                    operation: {
                        "seconds": [sample["seconds"] for sample in runs],
                        "cpu": [sample["cpu_seconds"] for sample in runs],
                        "peak": max(sample["peak_bytes"] for sample in runs),
                    }
                    for operation, runs in samples[name].items()
                }
            )
    return results


def median_seconds(result: dict[str, Any], operation: str) -> float:
    """Seconds of the median run; NaN for a method that failed."""
    return float("nan") if "error" in result else median(result[operation]["seconds"])


def speed(result: dict[str, Any], operation: str) -> float:
    """GB/s of the median run; NaN for a method that failed."""
    return float("nan") if "error" in result else float(result["bytes"]) / median_seconds(result, operation) / 1e9


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
            rows.append([name, *["-"] * 7, f"failed: {result['error']}"])
            continue
        measured, gbps = result[operation], speed(result, operation)
        rows.append(
            [
                name,
                str(len(measured["seconds"])),
                f"{median_seconds(result, operation):.3f}",
                f"{median(measured['cpu']):.3f}",
                f"{gbps:.2f}",
                f"{gbps / limit:.2f}",
                f"{gbps / orbax:.1f}",
                f"{measured['peak'] / MIB:.0f}",
                "",
            ]
        )
    headers = ["method", "runs", "median s", "cpu s", "GB/s", "x limit", "x orbax", "peak MiB", ""]
    return format_table(headers, rows)


SHORT = {"save": "save", "numpy": "restore to numpy", "jax": "restore to jax"}


def targets(results: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[bool, str]]:
    """The core's targets, each as (passed, what was measured); a failed method fails its targets."""
    checks: list[tuple[bool, str]] = []

    def versus(
        tree: str, operation: str, other: str, factor: float, other_operation: str = "", detail: str = ""
    ) -> None:
        ratio = speed(results[tree]["jaxstow"], operation) / speed(results[tree][other], other_operation or operation)
        label = f"{tree} {SHORT[operation]} >= {factor:g}x {other}"
        if other_operation:
            label += f" {SHORT[other_operation]}"
        checks.append((ratio >= factor, f"{label}: {ratio:.2f}x{detail}"))

    if "T1" in results:
        versus("T1", "save", "raw limit", 0.9)
        versus("T1", "save", "orbax", 3)
        versus("T1", "numpy", "raw limit", 0.9)
        versus("T1", "jax", "raw limit", 0.9, other_operation="numpy")
    if "T2" in results:
        t2 = results["T2"]
        for operation in OPERATIONS:
            ours, peer, orbax = (
                median_seconds(t2[method], operation) for method in ("jaxstow", "safetensors", "orbax")
            )
            factor = 1.2 if operation == "save" else 1
            versus("T2", operation, "safetensors", factor, detail=f" ({ours:.3f} s vs {peer:.3f} s)")
            versus("T2", operation, "orbax", 200, detail=f" (orbax {orbax:.2f} s)")
    for tree, tree_results in results.items():
        saved = tree_results["jaxstow"]
        peak = saved["save"]["peak"] / MIB if "error" not in saved else float("nan")
        checks.append(
            (
                peak <= SAVE_HEADROOM_MIB,
                f"{tree} save peak memory <= {SAVE_HEADROOM_MIB} MiB beyond the tree: {peak:.0f} MiB",
            )
        )
    return checks


def revision() -> str:
    """The commit of the working tree, so that a table can be traced to the code it measured."""
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "an unknown commit"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", choices=list(TREES), default=list(TREES))
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--serve", nargs=3, metavar=("TREE", "METHOD", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        tree_name, method_name, folder = args.serve
        serve(tree_name, METHODS[method_name], Path(folder))
        return
    methods = sorted(set(args.methods) | {"raw limit", "jaxstow", "safetensors", "orbax"}, key=list(METHODS).index)
    started = time.perf_counter()
    print(
        f"jaxstow benchmark at {revision()}: jax {jax.__version__}, numpy {np.__version__}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "Restores are warm-cache for every method (each file is read once before its restores; dropping the page "
        "cache needs root)."
    )
    print(
        "Memory is warm too: before each run, twice the tree's size is touched and freed, as this VM hands free pages "
        "back to its host within seconds and touching them again costs ~3 s/GiB."
    )
    print(
        "peak MiB: the largest growth of resident memory during one run (kernel high-water mark); a restore's "
        "includes the restored tree."
    )
    print(
        "cpu s: the median of the runs' CPU seconds, all threads; it shows a method's work when other processes "
        "share the cores."
    )
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="jaxstow-bench-", dir="/tmp") as folder:
        for tree_name in args.trees:
            results[tree_name] = run_tree(tree_name, methods, Path(folder))
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
