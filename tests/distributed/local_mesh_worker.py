"""One process of a 2-process ``jax.distributed`` run, 2 devices each, whose arrays are sharded over each process's
own devices (a mesh of ``jax.local_devices()``), started by ``tests/checkpoint/test_processes_disagree.py``:
``local_mesh_worker.py PROCESS PORT FOLDER``.

Step 1 holds the same values in both processes (a small array and one over the size whose values are compared),
step 2 a small array whose values differ. It restores step 1 whole and onto the local mesh, and prints one JSON line:
each save's error (``None`` where it committed), the steps committed and the values restored.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
process, port, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, heartbeat_timeout_seconds=10)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

local = NamedSharding(Mesh(np.array(jax.local_devices()), ("x",)), P("x"))


def on_local_mesh(values: np.ndarray) -> jax.Array:
    return jax.make_array_from_callback(values.shape, local, lambda index: values[index])


small, large = np.arange(4, dtype=np.float32), np.arange(1 << 16, dtype=np.float32)
saves = {
    1: {"small": on_local_mesh(small), "large": on_local_mesh(large)},
    2: {"small": on_local_mesh(small + 100 * process)},
}
report: dict = {"process": process, "errors": {}}
with CheckpointManager(folder, process_timeout=30) as manager:
    for step, tree in saves.items():
        try:
            manager.save(step, {"state": tree})
            manager.wait()
            report["errors"][step] = None
        except Exception as error:
            report["errors"][step] = f"{type(error).__name__}: {error}"
    report["steps"] = manager.steps()
    whole = manager.restore(step=1)["state"]
    like = {
        "state": {name: jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=local) for name, array in whole.items()}
    }
    fitted = manager.restore(step=1, like=like)["state"]
    report["restored"] = {
        name: bool(np.array_equal(np.asarray(array), {"small": small, "large": large}[name]))
        for name, array in whole.items()
    }
    report["fitted"] = {
        name: all(
            np.array_equal(np.asarray(shard.data), {"small": small, "large": large}[name][shard.index])
            for shard in array.addressable_shards
        )
        for name, array in fitted.items()
    }
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
