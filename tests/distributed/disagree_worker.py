"""One process of a 2-process ``jax.distributed`` run whose processes disagree, started by
``tests/checkpoint/test_processes_disagree.py``: ``disagree_worker.py PROCESS PORT FOLDER``.

It saves steps with the same values in both processes (numpy arrays copied or not, a per-process leaf of its own,
global arrays replicated over both), then steps where process 1 saves another small array, another Python value,
other metrics or metadata, or other copies of a small or a large replicated global array,
then restores a different step in each process, other items in each, one leaf onto another sharding in each, and the
same step in both; then saves a step
to a second folder through managers that keep other steps in each process. It prints one JSON line: the steps
committed, the error of each save or restore that failed (``None`` where it did not), and the values restored.
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
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxstow  # noqa: E402
from jaxstow import CheckpointManager, KeepPolicy  # noqa: E402

mesh = jax.make_mesh((2,), ("x",))
whole = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
w = jax.make_array_from_callback(whole.shape, NamedSharding(mesh, P("x")), lambda index: whole[index])


def replicated(rows: int, plus: float) -> jax.Array:
    """A global array of ``rows`` rows replicated over both processes, ``plus`` added to the copy of this one."""
    values = np.arange(rows * 64, dtype=np.float32).reshape(rows, 64) + plus
    return jax.make_array_from_callback(values.shape, NamedSharding(mesh, P()), lambda index: values[index])


def state(*, host: float = 0.0, k: int = 0, small: float = 0.0, large: float = 0.0) -> dict:
    leaves = {"w": w, "host": np.full(4, host, np.float32), "k": k, "mine": jaxstow.per_process({"p": process})}
    return {"state": leaves | {"small": replicated(2, small), "large": replicated(1024, large)}}  # 512 B; 256 KiB


other = 1.0 if process == 1 else 0.0
saves = {
    1: ({"items": state(), "copy": True, "metrics": {"loss": 0.5}, "metadata": {"run": "a"}}),
    2: ({"items": state(), "copy": False}),
    3: ({"items": state(host=other)}),
    4: ({"items": state(k=process)}),
    5: ({"items": state(), "metrics": {"loss": other}}),
    6: ({"items": state(), "metadata": {"who": process}}),
    7: ({"items": state(small=other)}),
    8: ({"items": state(large=other)}),
}
report: dict = {"process": process, "errors": {}}
with CheckpointManager(folder, process_timeout=30) as manager:
    for step, arguments in saves.items():
        items = arguments.pop("items")
        try:
            manager.save(step, items, **arguments)
            manager.wait()
            report["errors"][step] = None
        except Exception as error:
            report["errors"][step] = f"{type(error).__name__}: {error}"
    report["steps"] = manager.steps()
    like = state()
    try:
        manager.restore(step=2 if process == 0 else 1, like=like)
        report["different_steps"] = None
    except Exception as error:
        report["different_steps"] = f"{type(error).__name__}: {error}"
    try:
        manager.restore(step=1, like=like, items=["state"] if process == 0 else None)
        report["different_items"] = None
    except Exception as error:
        report["different_items"] = f"{type(error).__name__}: {error}"
    restored = manager.restore(step=1, like=like)["state"]
    report["restored"] = {
        "host": restored["host"].tolist(),
        "k": restored["k"],
        "mine": restored["mine"],
        "step": manager.restored.step if manager.restored else None,
    }
for broadcast in (None, True):  # one leaf restored onto another sharding in each process: the sides disagreed
    with CheckpointManager(folder, process_timeout=30, broadcast_restore=broadcast) as manager:
        like = state()
        layout = NamedSharding(mesh, P() if process == 1 else P("x"))
        like["state"]["w"] = jax.make_array_from_callback(whole.shape, layout, lambda index: whole[index])
        try:
            manager.restore(step=1, like=like)
            report[f"other_shardings_{broadcast}"] = None
        except Exception as error:
            report[f"other_shardings_{broadcast}"] = f"{type(error).__name__}: {error}"
with CheckpointManager(folder + "-kept", keep=KeepPolicy(keep_last=2 + process), process_timeout=30) as manager:
    try:
        manager.save(1, state())
        manager.wait()
        report["other_keep"] = None
    except Exception as error:
        report["other_keep"] = f"{type(error).__name__}: {error}"
    report["kept_steps"] = manager.steps()
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
