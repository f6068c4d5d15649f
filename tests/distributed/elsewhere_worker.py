"""One process of a ``jax.distributed`` run of 2 CPU devices a process, started by tests/checkpoint/test_restore_elsewhere.py:
``elsewhere_worker.py ACTION PROCESS COUNT PORT FOLDER``.

``save`` saves step 1, a (16, 8) array sharded over a mesh of every process's devices. ``restore`` restores it onto
layouts that hold it on the first four devices only (the saved mesh, a mesh of those devices replicated, and split),
so that processes beyond the second hold none of it, and checks every shard it holds. Prints one JSON line: per
layout, the shards held, or the error.
"""

from __future__ import annotations

import json
import os
import sys

action, process, count, port, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402
from jaxstow.errors import JaxstowError  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=count, process_id=process)
W = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
report: dict[str, object] = {}
with CheckpointManager(folder) as manager:
    if action == "save":
        mesh = jax.make_mesh((jax.device_count(),), ("data",))
        manager.save(1, {"w": jax.make_array_from_callback(W.shape, NamedSharding(mesh, P("data")), lambda i: W[i])})
        manager.wait()
    else:
        first = jax.make_mesh((4,), ("q",), devices=jax.devices()[:4])
        for name, sharding in [
            ("saved", "saved"),
            ("replicated", NamedSharding(first, P())),
            ("split", NamedSharding(first, P("q"))),
        ]:
            try:
                restored = manager.restore(1, sharding=sharding)["w"]
            except JaxstowError as error:
                report[name] = f"{type(error).__name__}: {error}"
                continue
            assert restored.shape == W.shape and restored.dtype == W.dtype, (restored.shape, restored.dtype)
            for shard in restored.addressable_shards:
                np.testing.assert_array_equal(np.asarray(shard.data), W[shard.index])
            report[name] = len(restored.addressable_shards)
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
