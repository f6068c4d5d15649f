"""One process of a two-process ``jax.distributed`` training loop that asks ``CheckpointManager.should_save`` at every
step, with ``save_every`` too large to save again: ``preempted.py PROCESS PORT FOLDER``.

It saves step 1 (the first step of a run), runs steps until ``should_save`` says yes again, which only a preemption
notice (SIGTERM to either process) can make it say, printing ``ready`` at step 10; it saves that step and prints one
JSON line with the steps it saved.
"""

from __future__ import annotations

import json
import os
import sys
import time

process, port, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, heartbeat_timeout_seconds=10)

import numpy as np  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

saved = []
with CheckpointManager(folder, save_every=1_000_000) as manager:
    for step in range(1, 1_000_000):
        if manager.should_save(step):
            manager.save(step, {"w": np.full(2, step)})
            saved.append(step)
            if len(saved) == 2:
                break
        if step == 10:
            print("ready", flush=True)
        time.sleep(0.005)
print(json.dumps({"saved": saved}), flush=True)
