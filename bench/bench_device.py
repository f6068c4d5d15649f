"""Restoring to and saving from the device jax sees: jaxstow against its peers and the limits, in one run.

Restore (warm page cache; cold too where the cache can be dropped): ``jaxstow.load`` (its default path, and the
pipeline), ``safetensors.flax.load_file`` followed by ``jax.device_put``, fastsafetensors and InstantTensor where they
import; the limits, measured in the same run: a bare ``device_put`` of the same bytes from ``pinned_host`` memory, and
a bare read of the file. Save: the time the caller is blocked, the total time and the peak extra host memory of
``jaxstow.CheckpointManager.save`` (its default ``host_memory_limit``, and a budget of a quarter of the tree) against
orbax's ``StandardCheckpointer``. Trees of bf16 and f32 leaves of an LLM's sizes; rounds interleaved, medians, ratios.

With no accelerator it prints ``no accelerator`` and the CPU table, at smaller sizes so that it stays fast.
Run: ``python bench/bench_device.py`` (``--rounds``, ``--sizes-mib``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
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
    restorers["limit: device_put from pinned_host"] = lambda: jax.device_put(
        pinned, jax.sharding.SingleDeviceSharding(device)
    )
    return restorers


def _restore_rows(path: str, nbytes: int, rounds: int, cold: bool) -> list[list[str]]:
    restorers = _restorers(path, nbytes)
    seconds: dict[str, list[float]] = {name: [] for name in restorers}
    order, names = random.Random(0), list(restorers)
    for _ in range(rounds):
        order.shuffle(names)
        for name in names:
            if cold:
                drop_caches()
            seconds[name].append(measure(lambda name=name: jax.block_until_ready(restorers[name]())).seconds)
    base = median(seconds["jaxstow.load (default)"])
    rows = []
    for name, values in seconds.items():
        time = median(values)
        rows.append([name, f"{time * 1e3:.0f}", f"{nbytes / time / (1 << 30):.2f}", f"{time / base:.2f}x"])
    return rows


def _save_rows(tree: dict[str, jax.Array], nbytes: int, folder: str, rounds: int) -> list[list[str]]:
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
    rows = []
    for name, values in results.items():
        blocked_s, total = median([v[0] for v in values]), median([v[1] for v in values])
        peak = median([float(v[2]) for v in values])
        rows.append(
            [name, f"{blocked_s * 1e3:.0f}", f"{total * 1e3:.0f}", f"{100 * blocked_s / total:.0f}%",
             f"{peak / _MIB:.0f}", f"{total / base:.2f}x"]
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes-mib", type=int, nargs="*", default=None)
    args = parser.parse_args()
    device = jax.devices()[0]
    accelerator = device.platform != "cpu"
    sizes = args.sizes_mib or ([1024, 4096] if accelerator else [64, 256])
    leaf = (64 if accelerator else 8) * _MIB
    if not accelerator:
        print(f"no accelerator: the CPU table, with trees of {sizes} MiB rather than an accelerator's 1 and 4 GiB")
    print(f"device: {device.device_kind} ({device.platform}); leaves of {leaf // _MIB} MiB, bf16 and f32 in turn")
    why_not_cold = cannot_drop()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        for size in sizes:
            tree = _tree(size * _MIB, leaf)
            nbytes = sum(array.nbytes for array in tree.values())
            path = os.path.join(folder, f"tree-{size}.safetensors")
            jaxstow.save(path, tree)
            for cold in (False, True) if why_not_cold is None else (False,):
                header = ["restore " + ("cold" if cold else "warm") + f" {size} MiB", "ms", "GiB/s", "vs jaxstow"]
                print(format_table(header, _restore_rows(path, nbytes, args.rounds, cold)), end="\n\n")
            header = [f"save {size} MiB", "blocked ms", "total ms", "blocked", "peak MiB", "vs jaxstow"]
            print(format_table(header, _save_rows(tree, nbytes, folder, args.rounds)), end="\n\n")
            os.remove(path)
            del tree
    if why_not_cold is not None:
        print(f"cold page cache: not measured ({why_not_cold})")


if __name__ == "__main__":
    main()
