"""Restore benchmarks: abstract-target restores of T1, one leaf out of T1, and T2, side by side with the peers.

Every file is written once, read once to warm the page cache, then restored ``--rounds`` times per method in turn;
the table gives the median. Targets (issue "restore anything onto anything"):

- T1 restored to ``jax.Array`` (abstract target) >= 0.9x the speed of ``readinto`` preallocated numpy arrays;
- one 4 MiB leaf of a 1.1 GB file (T1's leaves and a 4 MiB one, written by each library) opened, read, verified and
  closed (``with jaxstow.open(path) as reader: reader[name]``) in <= 1% of the time of the full T1 restore, and in
  <= 1.1x the time of ``with safe_open(path, framework="numpy") as file: file.get_tensor(name)``, both returning
  numpy arrays. Two ways, both judged (``--leaf-only`` runs only these): *repeated*, each method called 20 times in
  a row in each round, every result let go before the next call, as a loop over leaves does, the round's best
  kept (the memory of the call before is there to take again: ``np.empty``'s from the allocator for safetensors,
  the kept buffers of ``jaxstow._util.buffers`` for jaxstow); *fresh memory*, one call per round after the
  allocator's free memory is handed back to the system (``malloc_trim``), so that both touch new pages, as the
  first read of a process does; the median of the rounds, methods interleaved in a shuffled order. Both ways the
  file was opened before, so jaxstow takes the header it checked then (``jaxstow._format.header_cache``);
- T2 (10,000 small leaves) restored no slower than safetensors.

Then cold-cache restores (the page cache dropped before each run, which needs root: skipped with the reason
otherwise): T1 and T2 restored by jaxstow and by ``safetensors.numpy.load_file``, against the parallel-read limit of
the disk measured in the same rounds: 8 and 16 threads reading disjoint ranges with ``preadv``, through the page
cache and with ``O_DIRECT``. The *limit* is the best of them reading into fresh memory, as a restore must (its new
arrays' pages are touched for the first time by the reads, which costs about 0.7 CPU-s per GiB on this virtual
machine); the *ceiling* is the best of them reading into a buffer whose pages were touched before the clock started,
which no restore that returns new arrays can reach. Every round runs the methods in a shuffled order. Targets: cold T1
restore >= 0.9x the parallel-read limit and >= 2x ``safetensors.numpy.load_file``; the ratio to the ceiling is shown
beside.

Run: ``python bench/bench_restore.py [--rounds N] [--cold-rounds N] [--leaf-only]``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from cold import cannot_drop, drop_caches, parallel_read
from timing import format_table, measure, median, warm_cache
from trees import make_t1, make_t2

import jaxstow
from jaxstow._util.buffers import release_kept

Thunk = Callable[[], Any]


def _ready(tree: Any) -> Any:
    return jax.block_until_ready(tree)


def _read_into(path: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    with open(path, "rb", buffering=0) as file:
        for array in arrays:
            file.readinto(memoryview(array.reshape(-1).view(np.uint8)))
    return arrays


def _timed(thunk: Thunk, rounds: int, warm_bytes: int = 0) -> float:
    """The median seconds of ``rounds`` runs, each after touching ``warm_bytes`` of fresh memory (see
    :func:`timing.warm_memory`: this machine hands free pages back to its host, and taking them again costs more than
    the reads measured here)."""
    return median([measure(lambda: _ready(thunk()), warm_bytes=warm_bytes).seconds for _ in range(rounds)])


def _interleaved(thunks: dict[str, Thunk], rounds: int, calls: int = 0) -> dict[str, float]:
    """The median seconds of each thunk over rounds that run the thunks in a shuffled order (fixed seed).

    ``calls == 0``: one call per round, the allocator's free memory (:func:`timing.measure`) and jaxstow's kept
    buffers handed back to the system before it.
    Else ``calls`` calls in a row per round, each result let go before the next; the round's best counts.
    """
    order, seconds = random.Random(0), {name: [] for name in thunks}
    names = list(thunks)
    for _ in range(rounds):
        order.shuffle(names)
        for name in names:
            if not calls:  # jaxstow's kept buffers go back to the system too: both touch new memory
                release_kept()
                seconds[name].append(measure(lambda name=name: _ready(thunks[name]())).seconds)
                continue
            best = float("inf")
            for _ in range(calls):
                start = time.perf_counter()
                _ready(thunks[name]())
                best = min(best, time.perf_counter() - start)
            seconds[name].append(best)
    return {name: median(values) for name, values in seconds.items()}


def _probe_leaf() -> np.ndarray:
    """The 4 MiB float32 leaf read alone: (1024, 1024)."""
    return np.random.default_rng(1).standard_normal((1024, 1024), dtype=np.float32)


def _safetensors_all(path: str) -> dict[str, Any]:
    from safetensors import safe_open

    with safe_open(path, framework="flax") as file:
        return {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 - safe_open has no __iter__


def _safetensors_one(path: str, name: str) -> Any:
    from safetensors import safe_open

    with safe_open(path, framework="numpy") as file:
        return file.get_tensor(name)


def _jaxstow_one(path: str, name: str) -> Any:
    with jaxstow.open(path) as reader:
        return reader[name]


_LEAF = "probe"  # T1 has no 4 MiB leaf: the one-leaf files are T1's leaves and this one


def write_leaf_files(folder: Path, flat: dict[str, Any]) -> tuple[Path, Path]:
    """The one-leaf files: ``flat`` (T1's leaves by name) and the 4 MiB leaf, written by jaxstow and by safetensors."""
    from safetensors.numpy import save_file

    probed = {**{name: np.asarray(leaf) for name, leaf in flat.items()}, _LEAF: _probe_leaf()}
    ours, theirs = folder / "t1-probe.jxs", folder / "t1-probe.safetensors"
    jaxstow.save(ours, probed)
    save_file(probed, str(theirs))
    for path in (ours, theirs):
        warm_cache(path)
    return ours, theirs


def bench_one_leaf(ours: Path, theirs: Path, rounds: int) -> dict[str, float]:
    """The seconds of one leaf read from an open reader, and opened, read and closed by each library, both ways."""
    with jaxstow.open(ours) as reader:
        methods = {
            "open reader": lambda: reader[_LEAF],
            "open + read": lambda: _jaxstow_one(str(ours), _LEAF),
            "safetensors": lambda: _safetensors_one(str(theirs), _LEAF),
        }
        repeated = _interleaved(methods, rounds * 3, calls=20)
        fresh = _interleaved(methods, rounds * 5)
    seconds = {f"{name}, repeated": value for name, value in repeated.items()}
    seconds.update({f"{name}, fresh memory": value for name, value in fresh.items()})
    for way in ("repeated", "fresh memory"):
        ratio = seconds[f"open + read, {way}"] / seconds[f"safetensors, {way}"]
        print(
            f"one leaf ({_probe_leaf().nbytes >> 20} MiB of a {os.path.getsize(ours) / 1e9:.2f} GB file), {way}: "
            f"open + read + verify {seconds[f'open + read, {way}'] * 1e3:.3f} ms (read from a reader open already "
            f"{seconds[f'open reader, {way}'] * 1e3:.3f} ms), safe_open + get_tensor "
            f"{seconds[f'safetensors, {way}'] * 1e3:.3f} ms: {ratio:.2f}x (<= 1.1x: {'PASS' if ratio <= 1.1 else 'MISS'})"
        )
    return seconds


def _orbax_abstract(path: str, abstract: Any) -> Any:
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer().restore(os.path.abspath(path), abstract)


def bench_t1(folder: Path, rounds: int) -> list[list[str]]:
    tree = make_t1()
    flat = {
        jaxstow._format.keypaths.path_to_str(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), tree)
    ours, theirs, orbax_dir, raw = folder / "t1.jxs", folder / "t1.safetensors", folder / "t1.orbax", folder / "t1.raw"
    jaxstow.save(ours, tree)
    from safetensors.numpy import save_file

    save_file({name: np.asarray(leaf) for name, leaf in flat.items()}, str(theirs))
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.abspath(orbax_dir), tree)
    checkpointer.wait_until_finished()
    with open(raw, "wb") as file:
        for leaf in jax.tree.leaves(tree):
            np.asarray(leaf).tofile(file)
    arrays = [np.empty(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(tree)]
    ours_probed, theirs_probed = write_leaf_files(folder, flat)
    del tree, flat
    for path in (ours, theirs, orbax_dir, raw):
        warm_cache(path)
    size = sum(array.nbytes for array in arrays)
    timings = {
        "raw readinto numpy": _timed(lambda: _read_into(str(raw), arrays), rounds, size),
        "jaxstow abstract -> jax": _timed(lambda: jaxstow.load(ours, like=abstract), rounds, size),
        "jaxstow no target -> jax": _timed(lambda: jaxstow.load(ours), rounds, size),
        "safetensors safe_open -> jax": _timed(lambda: _safetensors_all(str(theirs)), rounds, size),
        "orbax abstract -> jax": _timed(lambda: _orbax_abstract(str(orbax_dir), abstract), max(1, rounds // 2), size),
    }
    limit, full = timings["raw readinto numpy"], timings["jaxstow abstract -> jax"]
    rows = [[name, f"{seconds:.3f}", f"{limit / seconds:.2f}x"] for name, seconds in timings.items()]
    leaf = bench_one_leaf(ours_probed, theirs_probed, rounds)
    for name, seconds in leaf.items():
        way = name.split(", ")[1]
        versus = seconds / leaf[f"safetensors, {way}"]
        note = f"{seconds / full:.2%} of full, {versus:.2f}x safetensors" if "safetensors" not in name else ""
        rows.append([f"one 4 MiB leaf: {name}", f"{seconds:.5f}", note])
    worst = max(leaf["open + read, repeated"], leaf["open + read, fresh memory"])
    print(
        f"T1 targets: restore to jax {limit / full:.2f}x readinto (>= 0.9x: {'PASS' if limit / full >= 0.9 else 'MISS'}); "
        f"one leaf {worst / full:.2%} of full (<= 1%: {'PASS' if worst / full <= 0.01 else 'MISS'})"
    )
    return rows


def bench_t2(folder: Path, rounds: int) -> list[list[str]]:
    tree = make_t2()
    flat = {
        jaxstow._format.keypaths.path_to_str(path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }
    ours, theirs = folder / "t2.jxs", folder / "t2.safetensors"
    jaxstow.save(ours, tree)
    from safetensors.numpy import load_file, save_file

    save_file(flat, str(theirs))
    del tree
    timings = {
        "T2 jaxstow -> numpy": _timed(lambda: jaxstow.load(ours, as_numpy=True), rounds),
        "T2 safetensors -> numpy": _timed(lambda: load_file(str(theirs)), rounds),
        "T2 jaxstow -> jax": _timed(lambda: jaxstow.load(ours), rounds),
        "T2 safetensors -> jax": _timed(lambda: _safetensors_all(str(theirs)), rounds),
    }
    numpy_ratio = timings["T2 safetensors -> numpy"] / timings["T2 jaxstow -> numpy"]
    jax_ratio = timings["T2 safetensors -> jax"] / timings["T2 jaxstow -> jax"]
    print(
        f"T2 targets: restore to numpy {numpy_ratio:.2f}x safetensors' speed, to jax {jax_ratio:.2f}x "
        f"(>= 1: {'PASS' if min(numpy_ratio, jax_ratio) >= 1 else 'MISS'})"
    )
    return [[name, f"{seconds:.3f}", ""] for name, seconds in timings.items()]


#: The parallel reads that make the limit and the ceiling: (threads, bytes per read, O_DIRECT).
LIMIT_READS = ((8, 16 << 20, False), (16, 8 << 20, False), (8, 16 << 20, True), (16, 8 << 20, True))
_FRESH, _TOUCHED = "limit", "ceiling"


def _cold_methods(folder: Path) -> dict[str, tuple[str, Thunk]]:
    """The cold runs: name -> (the file it reads, the run)."""
    from safetensors.numpy import load_file, save_file

    methods: dict[str, tuple[str, Thunk]] = {}
    for name, make in (("T1", make_t1), ("T2", make_t2)):
        tree = make()
        ours, theirs = str(folder / f"cold-{name}.jxs"), str(folder / f"cold-{name}.safetensors")
        jaxstow.save(ours, tree)
        save_file(
            {
                jaxstow._format.keypaths.path_to_str(p): np.asarray(x)
                for p, x in jax.tree_util.tree_leaves_with_path(tree)
            },
            theirs,
        )
        del tree
        methods[f"{name} jaxstow -> numpy"] = (ours, lambda ours=ours: jaxstow.load(ours, as_numpy=True))
        methods[f"{name} jaxstow -> jax"] = (ours, lambda ours=ours: _ready(jaxstow.load(ours)))
        methods[f"{name} safetensors.numpy.load_file"] = (theirs, lambda theirs=theirs: load_file(theirs))
        for (threads, piece, direct), kind in itertools.product(
            LIMIT_READS if name == "T1" else (), (_FRESH, _TOUCHED)
        ):
            label = f"{name} {kind}: {threads} threads x {piece >> 20} MiB preadv{', O_DIRECT' if direct else ''}"
            methods[label] = (
                ours,
                lambda t=threads, p=piece, d=direct, f=ours, k=kind: parallel_read(
                    f, t, p, direct=d, fresh=k == _FRESH
                ),
            )
    return methods


def _is_limit(name: str) -> bool:
    return f" {_FRESH}:" in name or f" {_TOUCHED}:" in name


def _keep(name: str, times: dict[str, list[float]]) -> Callable[[Any], None]:
    """Keep the seconds a limit's read returns (the time of its reads alone)."""
    return lambda result: times[name].append(result) if _is_limit(name) else None


def bench_cold(folder: Path, rounds: int) -> list[list[str]]:
    reason = cannot_drop()
    if reason is not None:
        print(f"cold-cache restores skipped: {reason}")
        return []
    methods = _cold_methods(folder)
    sizes = {path: os.path.getsize(path) for path, _ in methods.values()}
    times: dict[str, list[float]] = {name: [] for name in methods}
    shuffler = random.Random(0)
    for _ in range(rounds):
        for name in shuffler.sample(list(methods), len(methods)):
            path, run = methods[name]
            drop_caches()
            sample = measure(run, inspect=_keep(name, times), warm_bytes=sizes[path] + (256 << 20))
            if not _is_limit(name):  # a limit's read times itself
                times[name].append(sample.seconds)
    seconds = {name: median(values) for name, values in times.items()}
    limit_name = min((name for name in seconds if f" {_FRESH}:" in name), key=seconds.__getitem__)
    ceiling_name = min((name for name in seconds if f" {_TOUCHED}:" in name), key=seconds.__getitem__)
    limit = sizes[methods[limit_name][0]] / seconds[limit_name]
    ceiling = sizes[methods[ceiling_name][0]] / seconds[ceiling_name]
    rows = [
        [
            f"cold {name}",
            f"{seconds[name]:.3f}",
            f"{sizes[path] / seconds[name] / 1e9:.2f} GB/s, {sizes[path] / seconds[name] / limit:.2f}x limit, "
            f"{sizes[path] / seconds[name] / ceiling:.2f}x ceiling",
        ]
        for name, (path, _) in methods.items()
    ]
    for tree in ("T1", "T2"):
        peer = seconds[f"{tree} safetensors.numpy.load_file"]
        for target in ("numpy", "jax"):
            ours = seconds[f"{tree} jaxstow -> {target}"]
            speed = sizes[methods[f"{tree} jaxstow -> {target}"][0]] / ours / limit
            line = (
                f"cold {tree} restore to {target}: {speed:.2f}x the parallel-read limit ({limit_name}), "
                f"{speed * limit / ceiling:.2f}x the ceiling, {peer / ours:.2f}x safetensors.numpy.load_file"
            )
            if tree == "T1":
                verdict = "PASS" if speed >= 0.9 and peer / ours >= 2 else "MISS"
                line += f" (>= 0.9x and >= 2x: {verdict})"
            print(line)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cold-rounds", type=int, default=3)
    parser.add_argument("--leaf-only", action="store_true", help="only the one-leaf comparison with safetensors")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"bench_restore at {commit or 'an unknown commit'}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        if args.leaf_only:
            flat = {
                jaxstow._format.keypaths.path_to_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(make_t1())
            }
            bench_one_leaf(*write_leaf_files(Path(folder), flat), args.rounds)
            print(f"load average at the end {os.getloadavg()[0]:.1f}")
            return
        rows = bench_t1(Path(folder), args.rounds) + bench_t2(Path(folder), args.rounds)
        rows += bench_cold(Path(folder), args.cold_rounds)
    print(format_table(["restore", "seconds", "vs readinto / note"], rows))


if __name__ == "__main__":
    main()
