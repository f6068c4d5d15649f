"""One process of ``bench_distributed.py``: ``distributed_worker.py PROCESS COUNT DEVICES PORT FOLDER MIB``.

Builds a tree of random float32 matrices (``MIB`` MiB in all) sharded over a global mesh of every process's devices, then
times (median of 3 interleaved rounds), between barriers so that the slowest process sets the figure: jaxstow's save (durable: fsync), orbax's
save (``StandardCheckpointer``, then an fsync of its files), the raw limit (each process writes the bytes of its
replica-0 shards with ``tofile`` and fsyncs them), and the restores of both onto a mesh of another shape. Prints one
JSON line: seconds per method, the bytes jaxstow's restore read (``rchar``) and the bytes its devices need. orbax
reads through tensorstore, whose reads ``rchar`` does not see, so only its time is compared.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time

process, count, devices, port, folder, mib = sys.argv[1:7]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=int(count), process_id=int(process))

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from timing import warm_memory  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

SIDE = 2048  # 16 MiB per leaf
LEAVES = max(1, int(mib) // 16)
WARM_BYTES = LEAVES * SIDE * SIDE * 4 // int(count) * 2


def fsync_tree(root: str) -> None:
    for where, _, files in os.walk(root):
        for name in files:
            descriptor = os.open(os.path.join(where, name), os.O_RDONLY)
            os.fsync(descriptor)
            os.close(descriptor)


def rchar() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def timed(name: str, run) -> float:
    warm_memory(
        WARM_BYTES
    )  # this machine hands free pages back to its host; taking them again is not the method's cost
    multihost_utils.sync_global_devices(f"before {name}")
    start = time.perf_counter()
    run()
    multihost_utils.sync_global_devices(f"after {name}")
    return time.perf_counter() - start


mesh = jax.make_mesh((2, len(jax.devices()) // 2), ("data", "model"))
saved = NamedSharding(mesh, P("data", "model"))


def random_shard(leaf: int, index: tuple[slice, ...]) -> np.ndarray:
    """The shard at ``index`` of leaf ``leaf``: random, so that no method gains by compressing it."""
    starts = [part.indices(SIDE)[0] for part in index]
    shape = [len(range(*part.indices(SIDE))) for part in index]
    return np.random.default_rng([leaf, *starts]).standard_normal(shape, np.float32)


tree = {
    f"layer{i}": jax.make_array_from_callback((SIDE, SIDE), saved, lambda index, i=i: random_shard(i, index))
    for i in range(LEAVES)
}
other = NamedSharding(jax.make_mesh((len(jax.devices()),), ("x",)), P(None, "x"))
abstract = {name: jax.ShapeDtypeStruct((SIDE, SIDE), np.float32, sharding=other) for name in tree}
me = int(process)
figures: dict[str, float] = {}


def jaxstow_save() -> None:
    with CheckpointManager(f"{folder}/jaxstow") as manager:
        manager.save(1, {"params": tree})


def orbax_save() -> None:
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(f"{folder}/orbax", tree)
    checkpointer.wait_until_finished()
    fsync_tree(f"{folder}/orbax")


def raw_save() -> None:
    path = f"{folder}/raw.{me}"
    with open(path, "wb") as file:
        for array in tree.values():
            for shard in array.addressable_shards:
                if shard.replica_id == 0:
                    np.asarray(shard.data).tofile(file)
        file.flush()
        os.fsync(file.fileno())


def jaxstow_restore() -> None:
    with CheckpointManager(f"{folder}/jaxstow") as manager:
        jax.block_until_ready(manager.restore(like={"params": abstract}))


def orbax_restore() -> None:
    import orbax.checkpoint as ocp

    jax.block_until_ready(ocp.StandardCheckpointer().restore(f"{folder}/orbax", abstract))


ROUNDS = 3
savers = [("raw save", raw_save), ("jaxstow save", jaxstow_save), ("orbax save", orbax_save)]
times: dict[str, list[float]] = {name: [] for name, _ in savers}
for round_ in range(ROUNDS):  # interleaved, so that the disk's state weighs on every method alike
    for name, run in savers:
        if me == 0:  # the method's own output of the round before
            shutil.rmtree(f"{folder}/{name.split()[0]}", ignore_errors=True)
        times[name].append(timed(f"{name} {round_}", run))
figures.update({name: statistics.median(values) for name, values in times.items()})
restores: dict[str, list[float]] = {"jaxstow restore": [], "orbax restore": []}
for round_ in range(ROUNDS):
    before = rchar()
    restores["jaxstow restore"].append(timed(f"jaxstow restore {round_}", jaxstow_restore))
    read = rchar() - before
    restores["orbax restore"].append(timed(f"orbax restore {round_}", orbax_restore))
figures.update({name: statistics.median(values) for name, values in restores.items()})
# The distinct boxes this process's devices hold after the restore (replicas on several of its devices count once).
boxes = {str(index) for index in other.addressable_devices_indices_map((SIDE, SIDE)).values()}
needed = len(boxes) * int(np.prod(other.shard_shape((SIDE, SIDE)))) * 4 * LEAVES
record = os.path.join(folder, "jaxstow", "1", "checkpoint.json")
report = {"process": me, "figures": figures, "read": read, "needed": needed, "bytes": LEAVES * SIDE * SIDE * 4}
print(json.dumps({**report, "record_bytes": os.path.getsize(record) if me == 0 else 0}))
jax.distributed.shutdown()
