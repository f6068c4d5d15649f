"""One process of a 2-process ``jax.distributed`` run in which one process misses the save of step 2, started by
``tests/checkpoint/test_skipped_save.py``: ``skipped_save_worker.py PROCESS PORT FOLDER CASE MODE``.

Both processes save step 1 of a global array sharded over both, and a count. Then, through a manager with
``process_timeout`` 5 s, each tries steps 2, 3 and 4, catching each save's error as a training loop would: in
``skip``, process 1 does not call the save of step 2; in ``raise``, process 0's save of step 2 raises before it begins
(metrics that are not numbers); in ``slow``, process 1 comes to the save of step 2 past the timeout. ``MODE``
``wait`` waits for each save; ``background`` does not (errors of a save in flight come from the next call). Then
both restore steps 3 and 4. Each prints one JSON line: the error of each save (``None`` where it raised none), the
steps committed, and whether each restored step holds the values saved as that step in every shard.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
process, port, folder, case, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, heartbeat_timeout_seconds=60)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from leaving import leave_once_every_process_reported  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

TIMEOUT = 5
sharding = NamedSharding(jax.make_mesh((2,), ("x",)), P("x"))


def values(step: int) -> np.ndarray:
    return np.arange(8, dtype=np.float32).reshape(4, 2) + 100 * step


def state(step: int) -> dict:
    whole = values(step)
    return {"w": jax.make_array_from_callback(whole.shape, sharding, lambda index: whole[index]), "count": step}


def holds(restored: dict, step: int) -> bool:
    """Whether ``restored`` is step ``step`` whole: this process's shard and the count (the other checks its own)."""
    shards = restored["w"].addressable_shards
    return int(restored["count"]) == step and all(
        np.array_equal(np.asarray(shard.data), values(step)[shard.index]) for shard in shards
    )


report: dict = {"process": process, "errors": {}}
with CheckpointManager(folder, process_timeout=60) as manager:  # processes start at different times
    manager.save(1, state(1))
with CheckpointManager(folder, process_timeout=TIMEOUT) as manager:
    for step in (2, 3, 4):
        report["errors"][step] = None
        if step == 2 and case == "skip" and process == 1:
            continue
        if step == 2 and case == "slow" and process == 1:
            time.sleep(1.5 * TIMEOUT)  # process 0 gives up on this save, then waits for the next
        metrics = {"loss": "high"} if step == 2 and case == "raise" and process == 0 else None
        try:
            manager.save(step, state(step), metrics=metrics)
            if mode == "wait":
                manager.wait()
        except Exception as error:
            report["errors"][step] = f"{type(error).__name__}: {error}"
    manager.wait()
    report["steps"] = manager.steps()
    report["restored"] = {step: holds(manager.restore(step, like=state(0)), step) for step in (3, 4)}
print(json.dumps(report), flush=True)
leave_once_every_process_reported(process, 2)
