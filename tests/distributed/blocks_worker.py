"""One process of a ``jax.distributed`` run of 1 CPU device a process, started by tests/read/test_block_checksums.py:
``blocks_worker.py ACTION PROCESS COUNT PORT FOLDER``.

``save`` saves step 1, a (3072, 1024) float32 array (12 MiB) split by rows over every process's device. ``restore``
(in another number of processes) restores it split by rows over its own, so that a process reads parts of the saved
shards, and checks every shard it holds. Prints one JSON line: the shards held, or the error.
"""

from __future__ import annotations

import json
import os
import sys

action, process, count, port, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402
from jaxstow.errors import JaxstowError  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=count, process_id=process)
W = np.arange(3072 * 1024, dtype=np.float32).reshape(3072, 1024)
mesh = jax.make_mesh((jax.device_count(),), ("x",))
report: dict[str, object] = {}
with CheckpointManager(folder, process_timeout=60) as manager:
    if action == "save":
        manager.save(1, {"w": jax.make_array_from_callback(W.shape, NamedSharding(mesh, P("x")), lambda i: W[i])})
        manager.wait()
    else:
        try:
            restored = manager.restore(1, sharding={"w": NamedSharding(mesh, P("x"))})["w"]
        except JaxstowError as error:
            report["error"] = f"{type(error).__name__}: {error}"
        else:
            for shard in restored.addressable_shards:
                np.testing.assert_array_equal(np.asarray(shard.data), W[shard.index])
            report["shards"] = len(restored.addressable_shards)
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
