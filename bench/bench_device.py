"""Restoring to and saving from the device jax sees: jaxstow against its peers and the limits, in one run.

Restore (warm page cache; cold too where the cache can be dropped): ``jaxstow.load`` (its default, the pipeline on
an accelerator, and each of its two paths), ``safetensors.flax.load_file`` followed by ``jax.device_put``, fastsafetensors and InstantTensor where they
import; the limits, measured in the same run: a bare ``device_put`` of the same bytes from ``pinned_host`` memory, and
a bare read of the file. Save: the time the caller is blocked, the total time and the peak extra host memory of
``jaxstow.CheckpointManager.save`` (its default ``host_memory_limit``, and a budget of a quarter of the tree) against
orbax's ``StandardCheckpointer``. Trees of bf16 and f32 leaves of an LLM's sizes; rounds interleaved, medians, ratios.
The device's peak during a save: in a fresh process that holds nothing on the device but the tree (put there from the
host, leaf by leaf), the device's ``peak_bytes_in_use`` after ``manager.save`` and ``wait`` over its ``bytes_in_use``
before, within the default budget and within half a leaf (every leaf written in pieces cut on the device).

It ends with the targets, measured on this device: a restore >= 0.8x the ``pinned_host`` ``device_put`` limit, a save
blocked <= 5% of its total, a device peak <= the tree + one piece. With no accelerator it prints ``no accelerator``,
the CPU's figures at smaller sizes so that it stays fast, and no device peak (a CPU device keeps no memory statistics).
Run: ``python bench/bench_device.py`` (``--rounds``, ``--sizes-mib``); the 4 GiB run of the targets on a GPU:
``python bench/bench_device.py --sizes-mib 4096``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from cold import cannot_drop, drop_caches
from timing import format_table, measure, median

import jaxstow

_MIB = 1 << 20
_LIMIT = "limit: device_put from pinned_host"
#: What a piece of a budget's save is at most (its module's rule: a quarter of the budget, at most 256 MiB).
_MAX_PIECE = 256 * _MIB


def _accelerator_present() -> bool:
    """Whether jax has a GPU or TPU, asked in a fresh process so that this one has not started a client yet."""
    command = [sys.executable, "-c", "import jax; print(jax.default_backend())"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()[-1] != "cpu"


def _tree(total: int, leaf: int) -> dict[str, jax.Array]:
    """Leaves of ``leaf`` bytes, bf16 and f32 in turn, ``total`` bytes in all, on the default device."""
    tree, key = {}, jax.random.key(0)
    for i in range(max(1, total // leaf)):
        dtype = jnp.bfloat16 if i % 2 == 0 else jnp.float32
        rows = leaf // (4096 * jnp.dtype(dtype).itemsize)
        tree[f"layer{i:03d}"] = jax.random.normal(jax.random.fold_in(key, i), (rows, 4096), dtype)
    return jax.block_until_ready(tree)


def _read_file(path: str, buffer: np.ndarray) -> None:
    with open(path, "rb", buffering=0) as file:
        view, done = memoryview(buffer), 0
        while count := file.readinto(view[done:]):
            done += count


def _restorers(path: str, nbytes: int) -> dict[str, Callable[[], Any]]:
    from safetensors.flax import load_file

    device = jax.devices()[0]
    restorers: dict[str, Callable[[], Any]] = {
        "jaxstow.load (default)": lambda: jaxstow.load(path),
        "jaxstow.load (pipeline=True)": lambda: jaxstow.load(path, pipeline=True),
        "jaxstow.load (pipeline=False)": lambda: jaxstow.load(path, pipeline=False),
        "safetensors.flax + device_put": lambda: jax.device_put(load_file(path), device),
    }
    if importlib.util.find_spec("fastsafetensors") is not None:
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        def fastsafetensors_load() -> Any:
            loader = SafeTensorsFileLoader(SingleGroup(), "cpu" if device.platform == "cpu" else "cuda:0")
            loader.add_filenames({0: [path]})
            buffers = loader.copy_files_to_device()
            tensors = {name: buffers.get_tensor(name) for name in buffers.key_to_rank_lidx}
            loader.close()
            return tensors

        restorers["fastsafetensors"] = fastsafetensors_load
    if importlib.util.find_spec("instanttensor") is not None:
        import instanttensor

        restorers["InstantTensor"] = lambda: instanttensor.load_file(path)
    buffer = np.empty(nbytes, np.uint8)
    restorers["limit: bare read of the file"] = lambda: _read_file(path, buffer)
    pinned = jax.device_put(
        np.ones(nbytes, np.uint8), jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    )
    restorers[_LIMIT] = lambda: jax.device_put(pinned, jax.sharding.SingleDeviceSharding(device))
    return restorers


def _restore_rows(path: str, nbytes: int, rounds: int, cold: bool) -> tuple[list[list[str]], float]:
    """The table's rows, and the default ``jaxstow.load``'s share of the pinned ``device_put`` limit (its time over
    jaxstow's)."""
    restorers = _restorers(path, nbytes)
    seconds: dict[str, list[float]] = {name: [] for name in restorers}
    order, names = random.Random(0), list(restorers)
    for _ in range(rounds):
        order.shuffle(names)
        for name in names:
            if cold:
                drop_caches()
            seconds[name].append(measure(lambda name=name: jax.block_until_ready(restorers[name]())).seconds)
    base, limit = median(seconds["jaxstow.load (default)"]), median(seconds[_LIMIT])
    rows = []
    for name, values in seconds.items():
        time = median(values)
        rows.append(
            [
                name,
                f"{time * 1e3:.0f}",
                f"{nbytes / time / (1 << 30):.2f}",
                f"{time / base:.2f}x",
                f"{limit / time:.2f}x",
            ]
        )
    return rows, limit / base


def _save_rows(tree: dict[str, jax.Array], nbytes: int, folder: str, rounds: int) -> tuple[list[list[str]], float]:
    """The table's rows, and the share of its total time that the default budget's save blocks the caller."""
    import orbax.checkpoint as ocp

    def jaxstow_save(limit: int | None) -> Callable[[str], float]:
        def run(where: str) -> float:
            manager = jaxstow.CheckpointManager(where, host_memory_limit=limit)
            blocked = measure(lambda: manager.save(0, tree)).seconds
            manager.close()
            return blocked

        return run

    def orbax_save(where: str) -> float:
        checkpointer = ocp.StandardCheckpointer()
        blocked = measure(lambda: checkpointer.save(os.path.join(where, "0"), tree)).seconds
        checkpointer.wait_until_finished()
        checkpointer.close()
        return blocked

    savers = {
        "jaxstow (default budget)": jaxstow_save(None),
        "jaxstow (budget = tree / 4)": jaxstow_save(max(1, nbytes // 4)),
        "orbax StandardCheckpointer": orbax_save,
    }
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in savers}
    order, names = random.Random(1), list(savers)
    for index in range(rounds):
        order.shuffle(names)
        for name in names:
            where = os.path.join(folder, f"save-{index}-{names.index(name)}")
            blocked: list[float] = []
            sample = measure(lambda name=name, where=where, blocked=blocked: blocked.append(savers[name](where)))
            results[name].append((blocked[0], sample.seconds, sample.peak_bytes))
            shutil.rmtree(where, ignore_errors=True)
    base = median([total for _, total, _ in results["jaxstow (default budget)"]])
    blocked_share = median([blocked / total for blocked, total, _ in results["jaxstow (default budget)"]])
    rows = []
    for name, values in results.items():
        blocked_s, total = median([v[0] for v in values]), median([v[1] for v in values])
        peak = median([float(v[2]) for v in values])
        rows.append(
            [name, f"{blocked_s * 1e3:.0f}", f"{total * 1e3:.0f}", f"{100 * blocked_s / total:.0f}%",
             f"{peak / _MIB:.0f}", f"{total / base:.2f}x"]
        )  # fmt: skip
    return rows, blocked_share


def _leaf_bytes(accelerator: bool) -> int:
    return (64 if accelerator else 8) * _MIB


def _peak_in_this_process(size: int, budget: str) -> dict[str, Any]:
    """Put a tree of ``size`` MiB on the device from the host (no other buffer there), save it within ``budget``
    (``default`` or ``half-leaf``), and read the device's peak over the tree."""
    device = jax.devices()[0]
    stats = device.memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return {"why": f"the {device.platform} device keeps no memory statistics"}
    leaf = _leaf_bytes(device.platform != "cpu")
    limit = None if budget == "default" else leaf // 2
    tree = {}
    for i in range(max(1, size * _MIB // leaf)):
        dtype = jnp.bfloat16 if i % 2 == 0 else jnp.float32
        rows = leaf // (4096 * jnp.dtype(dtype).itemsize)
        tree[f"layer{i:03d}"] = jax.device_put(np.ones((rows, 4096), dtype), device)
    jax.block_until_ready(tree)
    stats = device.memory_stats()
    before = stats["bytes_in_use"]
    floor = stats["peak_bytes_in_use"] - before  # a smaller peak of the save cannot show
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        manager = jaxstow.CheckpointManager(folder, host_memory_limit=limit)
        manager.save(0, tree)
        manager.wait()
        manager.close()
    extra = device.memory_stats()["peak_bytes_in_use"] - before
    piece = 0 if limit is None else min(limit // 4, _MAX_PIECE)
    return {"state": before, "floor": floor, "extra": extra, "piece": piece}


def _peak_rows(sizes: list[int]) -> tuple[list[list[str]], list[list[str]]]:
    """The device-peak table's rows and the targets' rows, each measured in a fresh process that has the device to
    itself: run before this one starts its own client on the device (which may reserve most of its memory)."""
    rows, targets = [], []
    for size in sizes:
        for budget, name in [("default", "default budget"), ("half-leaf", "budget of half a leaf")]:
            command = [sys.executable, __file__, "--device-peak", str(size), budget]
            result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1800)
            measured = json.loads(result.stdout.splitlines()[-1])
            if "why" in measured:
                return [], [[f"save {size} MiB: device peak", f"not measured: {measured['why']}", "<= one piece"]]
            state, extra, piece = (measured[key] / _MIB for key in ("state", "extra", "piece"))
            rows.append(
                [
                    f"save {size} MiB, {name}",
                    f"{state:.0f}",
                    f"{extra:.1f}",
                    f"{piece:.1f}",
                    f"{measured['floor'] / _MIB:.1f}",
                ]
            )
            targets.append(
                [f"save {size} MiB: device peak over the tree ({name})", f"{extra:.1f} MiB", f"<= {piece:.1f} MiB"]
            )
    return rows, targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes-mib", type=int, nargs="*", default=None)
    parser.add_argument("--device-peak", nargs=2, help=argparse.SUPPRESS)  # a fresh process's part: size, budget
    args = parser.parse_args()
    if args.device_peak is not None:
        size, budget = args.device_peak
        print(json.dumps(_peak_in_this_process(int(size), budget)))
        return
    accelerator = _accelerator_present()
    sizes = args.sizes_mib or ([1024, 4096] if accelerator else [64, 256])
    peak_rows, peak_targets = _peak_rows(sizes)  # first: a fresh process must have the device to itself
    device = jax.devices()[0]
    leaf = _leaf_bytes(accelerator)
    if not accelerator:
        print(f"no accelerator: the CPU table, with trees of {sizes} MiB rather than an accelerator's 1 and 4 GiB")
    where = f"{device.device_kind} ({device.platform})"
    print(f"device: {where}; leaves of {leaf // _MIB} MiB, bf16 and f32 in turn")
    why_not_cold = cannot_drop()
    targets = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        for size in sizes:
            tree = _tree(size * _MIB, leaf)
            nbytes = sum(array.nbytes for array in tree.values())
            path = os.path.join(folder, f"tree-{size}.safetensors")
            jaxstow.save(path, tree)
            for cold in (False, True) if why_not_cold is None else (False,):
                state = "cold" if cold else "warm"
                header = [f"restore {state} {size} MiB", "ms", "GiB/s", "vs jaxstow", "of the limit"]
                rows, share = _restore_rows(path, nbytes, args.rounds, cold)
                print(format_table(header, rows), end="\n\n")
                targets.append(
                    [f"restore {state} {size} MiB: jaxstow.load / pinned device_put", f"{share:.2f}x", ">= 0.8x"]
                )
            header = [f"save {size} MiB", "blocked ms", "total ms", "blocked", "peak MiB", "vs jaxstow"]
            rows, blocked = _save_rows(tree, nbytes, folder, args.rounds)
            print(format_table(header, rows), end="\n\n")
            targets.append(
                [f"save {size} MiB: blocked share of the total (default budget)", f"{100 * blocked:.1f}%", "<= 5%"]
            )
            os.remove(path)
            del tree
    if peak_rows:
        header = ["device peak", "tree MiB", "over the tree MiB", "one piece MiB", "unseen below MiB"]
        print(format_table(header, peak_rows), end="\n\n")
    if why_not_cold is not None:
        print(f"cold page cache: not measured ({why_not_cold})")
    if not accelerator:
        print("the targets are an accelerator's: the CPU's figures below are not theirs, which are not measured here")
    print(format_table([f"targets on {where}", "measured", "target"], targets + peak_targets))


if __name__ == "__main__":
    main()
