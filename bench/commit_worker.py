"""One process of ``bench_commit.py``: ``commit_worker.py PROCESS COUNT PORT FOLDER SAVES``.

It agrees on the steps saved (the first ``should_save``), then saves ``SAVES`` steps of a small tree (64 KiB of rows
per process, one CPU device each) and waits for each: to ``FOLDER/store`` alone, then with a local tier under
``FOLDER`` (every step locally, every 4th copied to the store). It counts the key-value messages it sets and reads
on jax's coordination service, and process 0 lists the keys left once every process is done. Prints one JSON line:
medians in seconds, messages per save.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

process, count, port, folder, saves = sys.argv[1:6]
me = int(process)

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=int(count), process_id=me)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager, LocalTier  # noqa: E402
from jaxstow._util import jax_compat  # noqa: E402

ROWS = 64 * int(count)  # 64 rows of 256 float32 per process: 64 KiB each
mesh = jax.make_mesh((int(count),), ("x",))
values = np.arange(ROWS * 256, dtype=np.float32).reshape(ROWS, 256)
tree = {"w": jax.make_array_from_callback(values.shape, NamedSharding(mesh, P("x")), lambda index: values[index])}
client = jax_compat.distributed_client()


class Counting:
    """The client, with every message it sets and every value it reads counted."""

    def __init__(self, inner: object) -> None:
        self.inner, self.sets, self.reads = inner, 0, 0

    def key_value_set(self, *arguments: object) -> object:
        self.sets += 1
        return self.inner.key_value_set(*arguments)  # type: ignore[attr-defined]

    def blocking_key_value_get(self, *arguments: object) -> object:
        self.reads += 1
        return self.inner.blocking_key_value_get(*arguments)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def measure(manager: CheckpointManager) -> dict[str, float]:
    counting = manager._coordinator.client = Counting(client) if int(count) > 1 else None
    start = time.perf_counter()
    manager.should_save(1)
    agreed = time.perf_counter() - start
    seconds = []
    for step in range(1, int(saves) + 1):
        start = time.perf_counter()
        manager.save(step, {"params": tree})
        manager.wait()
        seconds.append(time.perf_counter() - start)
    manager.close()
    sets, reads = (counting.sets, counting.reads) if counting is not None else (0, 0)
    return {"agree": agreed, "save": statistics.median(seconds), "sets": sets / int(saves), "reads": reads / int(saves)}


report: dict = {"process": me}
multihost_utils.sync_global_devices("start")
report["store"] = measure(CheckpointManager(f"{folder}/store", process_timeout=60))
multihost_utils.sync_global_devices("stored")
report["tiers"] = measure(
    CheckpointManager(f"{folder}/tiered", save_every=4, local=LocalTier(f"{folder}/local{me}"), process_timeout=60)
)
multihost_utils.sync_global_devices("done")
if me == 0 and client is not None:
    time.sleep(0.5)
    report["keys left"] = sorted(key for key, _ in client.key_value_dir_get("jaxstow/"))
print(json.dumps(report), flush=True)
multihost_utils.sync_global_devices("reported")
