"""Hugging Face sharded safetensors folders: a ~2 GiB folder of 4 shards restored by jaxstow and by safetensors.

The folder holds LLM-shaped leaves (attention 4096x4096 and MLP 11008x4096 bfloat16 weights, float32 norms, an
embedding), written by ``safetensors.numpy.save_file`` with ``model.safetensors.index.json``. Restored, page cache
warm, to ``jax.Array`` on one device and onto a 4-device mesh (rows split over the devices), by:

- ``jaxstow.load(folder)`` (one device) and ``jaxstow.huggingface.load(folder, like, names=str, sharding=...)``
  (each device's rows read by byte ranges);
- ``safetensors.flax.load_file`` per shard (one device), then ``jax.device_put`` onto the mesh;
- the raw read limit: every shard file read with 8 threads into fresh memory (``bench/cold.py``'s ``parallel_read``).

The methods run in interleaved rounds, in a shuffled order; the table gives the medians and each one's time as a
ratio to safetensors' and to the raw read. It runs in a subprocess with ``--xla_force_host_platform_device_count=4``.

Run: ``python bench/bench_hf.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HIDDEN, MLP, VOCAB = 4096, 11008, 8192


def _tensors(layer: int, rng: Any) -> dict[str, Any]:
    import ml_dtypes
    import numpy as np

    def weight(rows: int, columns: int) -> Any:
        return rng.integers(0, 1 << 16, (rows, columns), dtype=np.uint16).view(ml_dtypes.bfloat16)

    prefix = f"model.layers.{layer}"
    tensors = {f"{prefix}.self_attn.{name}.weight": weight(HIDDEN, HIDDEN) for name in "qkvo"}
    tensors |= {f"{prefix}.mlp.{name}.weight": weight(MLP, HIDDEN) for name in ("gate_proj", "up_proj")}
    tensors[f"{prefix}.mlp.down_proj.weight"] = weight(HIDDEN, MLP)
    tensors[f"{prefix}.input_layernorm.weight"] = rng.standard_normal(HIDDEN).astype(np.float32)
    return tensors


def _write(folder: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    groups = [[0, 1], [2], [3], [4]]
    weight_map, total = {}, 0
    for number, layers in enumerate(groups, start=1):
        tensors = {name: array for layer in layers for name, array in _tensors(layer, rng).items()}
        if number == 1:
            tensors["model.embed_tokens.weight"] = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
        file = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, file)
        total += sum(array.nbytes for array in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _run(rounds: int) -> None:
    import jax
    from cold import parallel_read
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from safetensors.flax import load_file
    from timing import format_table, median, warm_cache

    import jaxstow
    from jaxstow import huggingface

    mesh = jax.make_mesh((4,), ("x",))
    rows = NamedSharding(mesh, P("x"))
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        folder = Path(scratch) / "hf"
        folder.mkdir()
        _write(folder)
        shards = sorted(str(path) for path in folder.glob("*.safetensors"))
        size = sum(os.path.getsize(path) for path in shards)
        warm_cache(folder)
        with jaxstow.open(folder) as reader:
            like = reader.abstract  # a flat dict by tensor name, kept so by names=

        def safetensors_flax() -> dict[str, Any]:
            return {name: array for path in shards for name, array in load_file(path).items()}

        def placed(tree: dict[str, Any]) -> dict[str, Any]:
            return {name: jax.device_put(array, rows) for name, array in tree.items()}

        methods: dict[str, Callable[[], Any]] = {
            "jaxstow.load, 1 device": lambda: jaxstow.load(folder),
            "safetensors.flax.load_file per shard, 1 device": safetensors_flax,
            "jaxstow.huggingface.load, 4-device mesh": lambda: huggingface.load(folder, like, names=str, sharding=rows),
            "load_file per shard + device_put, 4-device mesh": lambda: placed(safetensors_flax()),
        }
        times: dict[str, list[float]] = {name: [] for name in [*methods, "raw read limit (8 threads)"]}
        for _ in range(rounds):
            order = list(times)
            random.shuffle(order)
            for name in order:
                if name in methods:
                    started = time.perf_counter()
                    result = jax.block_until_ready(methods[name]())
                    times[name].append(time.perf_counter() - started)
                    del result
                else:
                    times[name].append(sum(parallel_read(path, 8, 16 << 20, fresh=True) for path in shards))
    limit = median(times["raw read limit (8 threads)"])
    peer = {"1 device": median(times[list(methods)[1]]), "mesh": median(times[list(methods)[3]])}
    table = []
    for name, values in times.items():
        seconds = median(values)
        versus = peer["mesh" if "mesh" in name else "1 device"] if name in methods else None
        table.append(
            [
                name,
                f"{seconds:.3f}",
                f"{size / seconds / 2**30:.2f}",
                f"{versus / seconds:.2f}x" if versus else "",
                f"{limit / seconds:.2f}",
            ]
        )
    print(f"{size / 2**30:.2f} GiB folder of 4 shards, {len(like)} tensors; page cache warm; {rounds} rounds, medians")
    print(
        format_table(
            ["method", "s", "GiB/s", "speed vs safetensors", "speed vs raw read"],
            table,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        _run(args.rounds)
        return
    environment = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    command = [sys.executable, __file__, "--inside", "--rounds", str(args.rounds)]
    raise SystemExit(subprocess.run(command, env=environment, check=False).returncode)


if __name__ == "__main__":
    main()
