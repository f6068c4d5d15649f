"""One process of a 4-process ``jax.distributed`` run whose shards are each replicated over two of its processes,
started by ``tests/checkpoint/test_partial_replicas.py``: ``partial_replicas_worker.py PROCESS PORT FOLDER``.

The four devices (one per process) form a (data, model) = (2, 2) mesh, ``[[0, 1], [2, 3]]``: an array sharded on
``model`` and replicated on ``data`` has one half held by processes 0 and 2, the other by processes 1 and 3. It saves
step 1 with the same copies everywhere, then step 2 where process 3's copy of ``w`` differs from process 1's, then
restores step 1. It prints one JSON line: the error of each save (``None`` where it did not fail), the steps
committed and whether every shard restored holds the values saved.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
process, port, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=4, process_id=process, heartbeat_timeout_seconds=10)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

sharding = NamedSharding(Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model")), P("model"))
VALUES = {"a": np.arange(8 * 4, dtype=np.float32).reshape(8, 4), "w": np.arange(8 * 4, dtype=np.float32)[::-1]}
VALUES["w"] = VALUES["w"].reshape(8, 4).copy()


def state(plus: float = 0.0) -> dict:
    """``a`` and ``w``, with ``plus`` added to this process's copy of ``w``."""
    local = {"a": VALUES["a"], "w": VALUES["w"] + plus}
    return {name: jax.make_array_from_callback((8, 4), sharding, lambda i, v=v: v[i]) for name, v in local.items()}


report: dict = {"process": process, "errors": {}}
with CheckpointManager(folder, process_timeout=60) as manager:
    for step, plus in ((1, 0.0), (2, 100.0 if process == 3 else 0.0)):
        try:
            manager.save(step, {"params": state(plus)})
            manager.wait()
            report["errors"][step] = None
        except Exception as error:
            report["errors"][step] = f"{type(error).__name__}: {error}"
    report["steps"] = manager.steps()
    restored = manager.restore(step=1, like={"params": state()})["params"]
    report["restored"] = all(
        np.array_equal(np.asarray(shard.data), VALUES[name][shard.index])
        for name, array in restored.items()
        for shard in array.addressable_shards
    )
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
