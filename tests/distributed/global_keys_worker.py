"""One process of a 2-process ``jax.distributed`` run, 2 devices each, started by
``tests/checkpoint/test_keys_across_processes.py``: ``global_keys_worker.py PROCESS PORT FOLDER``.

Step 1 holds typed PRNG keys replicated over the global mesh (a jitted step's key), restored onto that mesh and
whole; step 2 keys sharded over it; step 3 an array on one device of process 1 (``jax.device_put(x, devices[2])`` in
both). It prints one JSON line: each save's error (``None`` where it committed), how long it took, and the restores.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
process, port, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, heartbeat_timeout_seconds=10)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("x",))
data = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(3), 4)))


def keys_over(spec: P) -> jax.Array:
    sharding = NamedSharding(mesh, spec)
    raw = jax.make_array_from_callback(data.shape, NamedSharding(mesh, P(*spec, None)), lambda index: data[index])
    return jax.jit(jax.random.wrap_key_data, out_shardings=sharding)(raw)


replicated = keys_over(P())
saves = {
    1: {"rng": replicated},
    2: {"rng": keys_over(P("x"))},
    3: {"w": jax.device_put(np.arange(4.0, dtype=np.float32), jax.devices()[2])},
}
report: dict = {"process": process, "errors": {}, "seconds": {}}
with CheckpointManager(folder, process_timeout=30) as manager:
    for step, tree in saves.items():
        start = time.monotonic()
        try:
            manager.save(step, {"state": tree})
            manager.wait()
            report["errors"][step] = None
        except Exception as error:
            report["errors"][step] = f"{type(error).__name__}: {error}"
        report["seconds"][step] = time.monotonic() - start
    report["steps"] = manager.steps()
    fitted = manager.restore(step=1, like={"state": {"rng": replicated}})["state"]["rng"]
    report["fitted_sharding"] = fitted.sharding == replicated.sharding
    report["fitted"] = all(
        np.array_equal(np.asarray(shard.data), data[shard.index])
        for shard in jax.random.key_data(fitted).addressable_shards
    )
    whole = manager.restore(step=1)["state"]["rng"]
    report["whole"] = bool(np.array_equal(np.asarray(jax.random.key_data(whole)), data))
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
