"""One process of a 2-process ``jax.distributed`` run, started by ``tests/checkpoint/test_large_values_compared.py``:
``large_values_worker.py PROCESS PORT FOLDER PATH``, ``PATH`` ``host`` or ``accelerator`` (the CPU's arrays taken
down an accelerator's path: held back, and brought to the host while written).

Unsharded arrays of 256 KiB (a numpy array saved with ``copy=True`` and a jax array on this process's device),
larger than those the processes compare whole: step 1 holds the same values in both processes, step 2 another
numpy array in process 1, step 3 another jax array. It prints one JSON line: each save's error (``None`` where it
committed) and the steps committed.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
process, port, folder, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process, heartbeat_timeout_seconds=10)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402
from jaxstow._write import host_budget  # noqa: E402

if path == "accelerator":
    host_budget._HOST_PLATFORMS = frozenset()
    host_budget._accelerators_present = lambda: True


def state(*, host: float = 0.0, device: float = 0.0) -> dict:
    """256 KiB on the host and 256 KiB on this process's device, whose last element is ``host`` and ``device``."""
    values = np.arange(1 << 16, dtype=np.float32)
    return {"host": np.append(values[:-1], host).astype(np.float32), "device": jnp.asarray(values).at[-1].set(device)}


other = 1.0 if process == 1 else 0.0
saves = {1: state(), 2: state(host=other), 3: state(device=other)}
report: dict = {"process": process, "errors": {}}
with CheckpointManager(folder, process_timeout=30) as manager:
    for step, tree in saves.items():
        try:
            manager.save(step, {"state": tree}, copy=True)
            manager.wait()
            report["errors"][step] = None
        except Exception as error:
            report["errors"][step] = f"{type(error).__name__}: {error}"
    report["steps"] = manager.steps()
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
