"""One process of ``bench_collectives.py``: ``collectives_worker.py MODE PROCESS COUNT PORT FOLDER URL ROWS_MIB REP_MIB``.

Saves ``rows`` (``ROWS_MIB`` MiB of float32, sharded by rows over every process) and ``rep`` (``REP_MIB`` MiB,
replicated on every process), restores them once at the default (untimed: the first restore's own costs, and the
sockets jaxstow listens on while it saves and restores), then restores them onto the same shardings, methods taking
turns round by round (3 rounds, 25 for a local disk; each round starts one method later), each timed between barriers
so that the slowest process sets the figure:

- ``s3``: saved to ``URL`` directly; restored through the capped proxy (``JAXSTOW_CAPPED_OPTIONS``) with
  ``broadcast_restore`` at its default and ``False`` (every process reads what it holds).
- ``local``: saved to and restored from the local ``FOLDER``, default against ``False``; then ``True`` (3 rounds).
- ``tiers``: each round saves a step with a local tier under ``FOLDER`` and ``URL`` as the persistent tier; process 1
  loses its local directory (a replaced host) and restores with its peers (persistent tier through the proxy), against
  the same step restored from the bucket through the proxy at the default.

Prints one JSON line: per method the median seconds and the bytes it fetched from the bucket in its last round
(listing included), the bytes fetched in all, and the listening sockets opened by a default save and restore (those
of jax's own collectives, opened before, left out; none measured in ``tiers``, whose local tier has peers).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import time

mode, process, count, port, folder, url, rows_mib, rep_mib = sys.argv[1:9]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=int(count), process_id=int(process))

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager, LocalTier  # noqa: E402
from jaxstow._storage import s3  # noqa: E402

DIRECT = json.loads(os.environ.get("JAXSTOW_STORAGE_OPTIONS", "{}"))
CAPPED = json.loads(os.environ.get("JAXSTOW_CAPPED_OPTIONS", "{}"))
COLUMNS = 1024
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

mesh = jax.make_mesh((int(count),), ("x",))
shardings = {"rows": NamedSharding(mesh, P("x")), "rep": NamedSharding(mesh, P())}
shapes = {"rows": (int(rows_mib) * 256, COLUMNS), "rep": (int(rep_mib) * 256, COLUMNS)}
values = {name: np.random.default_rng(i).standard_normal(shapes[name], np.float32) for i, name in enumerate(shapes)}
tree = {
    name: jax.make_array_from_callback(shapes[name], sharding, lambda index, name=name: values[name][index])
    for name, sharding in shardings.items()
}
like = {"params": {name: jax.ShapeDtypeStruct(shapes[name], np.float32, sharding=s) for name, s in shardings.items()}}
model = sum(value.nbytes for value in values.values())


def listening() -> set[str]:
    """The inodes of the sockets this process listens on (TCP state 0A), from /proc."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as lines:
            for line in lines.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    found.add(fields[9])
    return found


multihost_utils.sync_global_devices("collectives ready")  # jax's collectives (gloo) listen on sockets of their own
jax_sockets = listening()
opened: set[str] = set()


def check(restored) -> None:
    for name, leaf in restored["params"].items():
        for shard in leaf.addressable_shards:
            assert np.array_equal(np.asarray(shard.data), values[name][shard.index]), name


def timed(name: str, restore) -> tuple[float, int]:
    """Seconds between barriers, and the bytes this process fetched from the bucket meanwhile."""
    multihost_utils.sync_global_devices(f"before {name}")
    before, start = fetched[0], time.perf_counter()
    restored = restore()
    jax.block_until_ready(restored)
    multihost_utils.sync_global_devices(f"after {name}")
    seconds = time.perf_counter() - start
    check(restored)
    return seconds, fetched[0] - before


def restoring(where: str, options: dict | None, **settings):
    def restore():
        with CheckpointManager(where, storage_options=options, process_timeout=120, **settings) as manager:
            return manager.restore(like=like)

    return restore


def saved_and_warmed(where: str, options: dict | None) -> None:
    """A default save and restore, untimed, noting the sockets this process listens on while each manager is open."""
    with CheckpointManager(where, storage_options=DIRECT or None) as manager:
        manager.save(1, {"params": tree})
        manager.wait()
        opened.update(listening() - jax_sockets)
    with CheckpointManager(where, storage_options=options, process_timeout=120) as manager:
        check(manager.restore(like=like))
        opened.update(listening() - jax_sockets)


seconds: dict[str, list[float]] = {}
bytes_fetched: dict[str, int] = {}


def record(name: str, restore) -> None:
    took, got = timed(name, restore)
    seconds.setdefault(name, []).append(took)
    bytes_fetched[name] = got


def rounds(methods: dict, count: int = 3) -> None:
    """``count`` rounds of every method, each round starting one method later, so that none always goes first."""
    names = list(methods)
    for round_ in range(count):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            record(name, methods[name])


if mode == "s3":
    saved_and_warmed(url, CAPPED)
    rounds({"default": restoring(url, CAPPED), "every process reads": restoring(url, CAPPED, broadcast_restore=False)})
elif mode == "local":
    saved_and_warmed(folder, None)
    methods = {
        "default": restoring(folder, None),
        "every process reads": restoring(folder, None, broadcast_restore=False),
    }
    rounds(methods, 25)  # restores of a tenth of a second: many, for a median that the machine's load does not sway
    # then reading once, forced: a restore that follows it may run slower, and the two above follow it equally (never)
    rounds({"read once (forced)": restoring(folder, None, broadcast_restore=True)})
else:
    for round_ in range(3):
        local = f"{folder}/round{round_}/local{me}"
        where = f"{url}/round{round_}"
        tier = LocalTier(local)
        with CheckpointManager(where, storage_options=DIRECT, local=tier, process_timeout=120) as manager:
            manager.save(1, {"params": tree})
        if me == 1:
            shutil.rmtree(local)  # a replaced host
        methods = {
            "replaced host from peers": restoring(where, CAPPED, local=tier),
            "from the bucket": restoring(where, CAPPED),
        }
        for name in list(methods)[:: 1 if round_ % 2 == 0 else -1]:
            record(name, methods[name])
report = {
    "process": me,
    "model": model,
    "seconds": {name: statistics.median(times) for name, times in seconds.items()},
    "fetched": bytes_fetched,
    "total_fetched": fetched[0],
    "listening": None if mode == "tiers" else len(opened),
}
print(json.dumps(report), flush=True)
time.sleep(1 if me else 3)
os._exit(0)
