"""One process of a 2-process ``jax.distributed`` run in which process 0's part of a save fails after every process
agreed on its step, started by ``tests/checkpoint/test_failed_part.py``: ``failed_part_worker.py PROCESS PORT
FOLDER``.

In the first save of a run with ``save_every=10``, process 0 saves an array it deleted first (as donating it does),
which it cannot hold: its save raises once the processes agreed on the step, the other's returns and fails in the
background. Each process then asks ``should_save`` of steps 2 to 10 and saves those it is told to, waiting for each.
Each prints one JSON line: the steps ``should_save`` picked, the error of each save (``None`` where it raised none),
the steps committed and whether the last holds the values saved as it.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
process, port, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, heartbeat_timeout_seconds=60)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from leaving import leave_once_every_process_reported  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

sharding = NamedSharding(jax.make_mesh((2,), ("x",)), P("x"))


def state(step: int, *, deleted: bool = False) -> dict:
    whole = np.arange(4, dtype=np.float32) + 100 * step
    tree = {"w": jax.make_array_from_callback(whole.shape, sharding, lambda index: whole[index]), "count": step}
    if deleted:
        tree["donated"] = jax.numpy.ones(2)
        tree["donated"].delete()
    return tree


report: dict = {"process": process, "picked": [], "errors": {}}
with CheckpointManager(folder, save_every=10, process_timeout=5) as manager:
    for step in range(1, 11):
        if not manager.should_save(step):
            continue
        report["picked"].append(step)
        try:
            manager.save(step, state(step, deleted=step == 1 and process == 0))
            manager.wait()
            report["errors"][step] = None
        except Exception as error:
            report["errors"][step] = f"{type(error).__name__}: {error}"
    report["steps"] = manager.steps()
    restored = manager.restore(like=state(0))
    report["restored"] = int(restored["count"]) == 10 and all(
        np.array_equal(np.asarray(shard.data), 100 * 10 + np.arange(4)[shard.index])
        for shard in restored["w"].addressable_shards
    )
print(json.dumps(report), flush=True)
leave_once_every_process_reported(process, 2)
