"""One process of ``bench_replicas.py``: ``replicas_worker.py PROCESS COUNT PORT FOLDER URL MIB``.

Saves ``rows`` (``MIB`` MiB of float32, sharded by rows over every process) and ``rep`` (as large, replicated on every
process) with ``CheckpointManager`` into the local ``FOLDER`` and to ``URL`` on an S3 server (options as JSON in
``JAXSTOW_STORAGE_OPTIONS``), then restores the S3 step with every array replicated on every process (as many
data-parallel replicas as processes), reading each box once and gathering it (the default), and with every process
reading what it needs, rounds interleaved, between barriers. Prints one JSON line: the bytes of its own files of the local
step, and per method the median seconds and the bytes it fetched from S3 (headers included).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

process, count, port, folder, url, mib = sys.argv[1:7]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=int(count), process_id=int(process))

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402
from jaxstow._storage import s3  # noqa: E402

OPTIONS = json.loads(os.environ["JAXSTOW_STORAGE_OPTIONS"])
ROWS = int(mib) * (1 << 20) // 4 // 1024
me = int(process)
fetched = [0]


def counting(method):
    """``method`` of the S3 bucket, adding the bytes it fetched to ``fetched``."""

    def counted(*arguments, **options):
        result = method(*arguments, **options)
        fetched[0] += len(result[0]) if isinstance(result, tuple) else int(result)
        return result

    return counted


s3.S3Bucket.head = counting(s3.S3Bucket.head)
s3.S3Bucket.get_into = counting(s3.S3Bucket.get_into)

mesh = jax.make_mesh((len(jax.devices()),), ("x",))
values = {name: np.random.default_rng(seed).standard_normal((ROWS, 1024), np.float32) for seed, name in enumerate("ab")}
tree = {
    "rows": jax.make_array_from_callback((ROWS, 1024), NamedSharding(mesh, P("x")), lambda i: values["a"][i]),
    "rep": jax.make_array_from_callback((ROWS, 1024), NamedSharding(mesh, P()), lambda i: values["b"][i]),
}
for where, options in ((folder, None), (url, OPTIONS)):
    with CheckpointManager(where, storage_options=options) as manager:
        manager.save(1, {"params": tree})
with open(os.path.join(folder, "1", "checkpoint.json")) as file:
    record = json.load(file)
own = record["files"]["params"] if me == 0 else record["parts"]["params"][me - 1]
written = os.path.getsize(os.path.join(folder, "1", own))

replicated = NamedSharding(mesh, P())
like = {"params": {name: jax.ShapeDtypeStruct((ROWS, 1024), np.float32, sharding=replicated) for name in tree}}
methods = {"read once": None, "every process reads": False}
seconds: dict[str, list[float]] = {name: [] for name in methods}
bytes_fetched: dict[str, int] = {}
for round_ in range(3):
    for name, choice in methods.items():
        multihost_utils.sync_global_devices(f"before {name} {round_}")
        before, start = fetched[0], time.perf_counter()
        with CheckpointManager(url, storage_options=OPTIONS, broadcast_restore=choice) as manager:
            restored = manager.restore(like=like)
        jax.block_until_ready(restored)
        multihost_utils.sync_global_devices(f"after {name} {round_}")
        seconds[name].append(time.perf_counter() - start)
        bytes_fetched[name] = fetched[0] - before
        for key, leaf in restored["params"].items():
            assert np.array_equal(np.asarray(leaf.addressable_shards[0].data), values["a" if key == "rows" else "b"])
report = {
    "process": me,
    "written": written,
    "model": 2 * ROWS * 1024 * 4,
    "seconds": {name: statistics.median(times) for name, times in seconds.items()},
    "fetched": bytes_fetched,
}
print(json.dumps(report), flush=True)
time.sleep(1 if me else 3)
os._exit(0)
