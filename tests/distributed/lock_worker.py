"""One process of a 2-process ``jax.distributed`` run whose folder another manager holds at first, started by
``tests/checkpoint/test_lock_held_elsewhere.py``: ``lock_worker.py PROCESS PORT FOLDER``.

It saves step 1 while the other manager holds the folder's lock (process 0 alone takes it), says so in a file
``FOLDER.refused.PROCESS``, waits for the file ``FOLDER.free``, then saves steps 2 and 3. It prints one JSON line: the
error of each save (``None`` where it committed) and the steps committed.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
process, port, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, heartbeat_timeout_seconds=10)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

mesh = jax.make_mesh((2,), ("x",))
whole = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
w = jax.make_array_from_callback(whole.shape, NamedSharding(mesh, P("x")), lambda index: whole[index])
report: dict = {"process": process, "errors": {}}
with CheckpointManager(folder, process_timeout=30) as manager:
    for step in (1, 2, 3):
        try:
            manager.save(step, {"state": {"w": w}})
            manager.wait()
            report["errors"][step] = None
        except Exception as error:
            report["errors"][step] = f"{type(error).__name__}: {error}"
        if step == 1:
            open(f"{folder}.refused.{process}", "w").close()
            while not os.path.exists(f"{folder}.free"):
                time.sleep(0.05)
    report["steps"] = manager.steps()
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
