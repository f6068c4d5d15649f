"""One process of the two-tier rows of ``bench_distributed.py``: ``tiers_worker.py PROCESS COUNT PORT FOLDER URL MIB``.

Each round (3, interleaved) saves a tree of random float32 rows (``MIB`` MiB in all, sharded over one CPU device per
process) to the S3 bucket ``URL`` alone, and to a local tier under ``FOLDER`` with ``URL`` as the persistent tier;
then process 1 loses its local directory (a replaced host) and the newest step is restored with its shards from a peer,
against a restore of the same bytes from S3. Times run between barriers, so that the slowest process sets each
figure. Prints one JSON line of medians: seconds per figure.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import sys
import time

process, count, port, folder, url, mib = sys.argv[1:7]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=int(count), process_id=int(process))

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager, LocalTier  # noqa: E402

OPTIONS = json.loads(os.environ["JAXSTOW_STORAGE_OPTIONS"])
COLUMNS = 1024
ROWS = int(mib) * (1 << 20) // (COLUMNS * 4)
me = int(process)
sharding = NamedSharding(jax.make_mesh((int(count),), ("x",)), P("x"))
values = np.random.default_rng(0).standard_normal((ROWS, COLUMNS), np.float32)
tree = {"w": jax.make_array_from_callback(values.shape, sharding, lambda index: values[index])}
like = {"params": {"w": jax.ShapeDtypeStruct(values.shape, np.float32, sharding=sharding)}}


def between_barriers(name: str, run) -> float:
    multihost_utils.sync_global_devices(f"before {name}")
    start = time.perf_counter()
    run()
    multihost_utils.sync_global_devices(f"after {name}")
    return time.perf_counter() - start


def manager(round_: int, tiered: bool) -> CheckpointManager:
    local = {"local": LocalTier(f"{folder}/round{round_}/local{me}"), "save_every": 1000} if tiered else {}
    where = f"{url}/round{round_}/{'tiers' if tiered else 's3'}"
    return CheckpointManager(where, storage_options=OPTIONS, process_timeout=120, **local)


def _save(saving: CheckpointManager, blocked: list[float]) -> None:
    """Save step 2 and wait until it is held; ``blocked`` gets the time ``save`` blocked the training loop for."""
    start = time.perf_counter()
    saving.save(2, {"params": tree})
    blocked.append(time.perf_counter() - start)
    saving.wait()


times: dict[str, list[float]] = {}
for round_ in range(3):
    for tiered in (False, True):
        kind = "local tier" if tiered else "S3"
        with manager(round_, tiered) as saving:
            saving.save(1, {"params": tree})  # the first step goes to S3 in both
            saving.wait()
            blocked: list[float] = []
            total = between_barriers(f"save {kind} {round_}", functools.partial(_save, saving, blocked))
        times.setdefault(f"{kind} save blocked", []).append(blocked[0])
        times.setdefault(f"{kind} save", []).append(total)
    if me == 1:
        shutil.rmtree(f"{folder}/round{round_}/local1")  # a replaced host
    with manager(round_, True) as restoring:
        times.setdefault("replaced host restore from peers", []).append(
            between_barriers(f"peers {round_}", lambda: jax.block_until_ready(restoring.restore(like=like)))
        )
        assert restoring.restored is not None and restoring.restored.step == 2
    with manager(round_, False) as restoring:
        times.setdefault("restore from S3", []).append(
            between_barriers(f"s3 {round_}", lambda: jax.block_until_ready(restoring.restore(2, like=like)))
        )
print(json.dumps({"process": me, "figures": {name: statistics.median(found) for name, found in times.items()}}))
jax.distributed.shutdown()
