"""One process of a 2-process ``jax.distributed`` run whose processes spell one folder differently (a relative path,
an absolute one with a trailing ``/``), started by ``tests/checkpoint/test_folder_spellings.py``:
``spelling_worker.py PROCESS PORT FOLDER``. It saves steps 1 and 2 and prints one JSON line: each save's error
(``None`` where it committed) and the steps committed.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
process, port, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, heartbeat_timeout_seconds=10)

import numpy as np  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

report: dict = {"process": process, "errors": {}}
with CheckpointManager(folder, process_timeout=20) as manager:
    for step in (1, 2):
        try:
            manager.save(step, {"state": {"w": np.ones(4, np.float32)}})
            manager.wait()
            report["errors"][step] = None
        except Exception as error:
            report["errors"][step] = f"{type(error).__name__}: {error}"
    report["steps"] = manager.steps()
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
