"""One process of a 2-process ``jax.distributed`` run in which only one process calls a save, started by
``tests/checkpoint/test_process_timeouts.py``: ``lonely_save_worker.py PROCESS PORT FOLDER SAVER``.

Both processes save step 1 through one manager (``process_timeout`` 3 s); then process ``SAVER`` alone saves step 2
while the other stays alive without calling it, then waits for the file ``FOLDER.done``. The saver prints one JSON
line: the error of its save of step 2, how long it took, and the steps it then sees.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
process, port, folder, saver = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, heartbeat_timeout_seconds=30)

import numpy as np  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

with CheckpointManager(folder, process_timeout=3) as manager:
    manager.save(1, {"state": {"w": np.arange(4.0)}})
    manager.wait()
    if process == saver:
        start = time.monotonic()
        try:
            manager.save(2, {"state": {"w": np.arange(4.0)}})
            manager.wait()
            error = None
        except Exception as failed:
            error = f"{type(failed).__name__}: {failed}"
        report = {"process": process, "error": error, "seconds": time.monotonic() - start, "steps": manager.steps()}
        print(json.dumps(report), flush=True)
    else:
        while not os.path.exists(f"{folder}.done"):
            time.sleep(0.05)
os._exit(0)  # without jax's shutdown barrier, which the other process, gone, would hold up
