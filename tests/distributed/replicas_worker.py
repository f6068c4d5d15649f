"""One process of a ``jax.distributed`` run, started by the replica and per-process tests:
``replicas_worker.py ACTION PROCESS COUNT DEVICES PORT FOLDER``.

``save`` saves step 1: ``rows``, sharded by rows over every device of the run, ``rep``, replicated on every device,
``loader``, a :func:`jaxstow.per_process` value of this process's own, and ``it``, a stateful iterator at this
process's own position. ``restore`` restores it with ``rows`` split over the ``model`` axis of a (data, model) mesh
of this run's devices (so each box of it is held by some of the processes) and ``rep`` replicated, checks every
array bit for bit and reports the bytes this process read and the per-process values it got (with another process
count than the save's, it reports the error and then every process's values, ``per_process="all"``); then the same
with ``broadcast_restore`` at its default (``--broadcast`` forces it: ``on`` or ``off``), reporting the bytes read.
Shared boxes are gathered in chunks of at most ``--chunk-bytes``, with jax's CPU collectives ``--collectives``. ``--die K`` makes process K kill itself with
SIGKILL (``--stop K``: stop itself with SIGSTOP) when its restore first reads for the broadcast;
``--stop-after-gather K`` makes it stop after its first gather (before the barrier of the next). Each prints one JSON
line, with ``listening``: the sockets this process listens on that jax's own collectives did not open.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("action", choices=["save", "restore"])
parser.add_argument("process", type=int)
parser.add_argument("count", type=int)
parser.add_argument("devices", type=int)
parser.add_argument("port", type=int)
parser.add_argument("folder")
parser.add_argument("--die", type=int, default=-1)
parser.add_argument("--stop", type=int, default=-1)
parser.add_argument("--stop-after-gather", type=int, default=-1)
parser.add_argument("--broadcast", choices=["on", "off"], default="on")
parser.add_argument("--chunk-bytes", type=int, default=0)
parser.add_argument("--collectives", default="gloo")
parser.add_argument("--process-timeout", type=float, default=60.0)
args = parser.parse_args()
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", None if args.collectives == "none" else args.collectives)
stopping = max(args.die, args.stop, args.stop_after_gather) >= 0
if stopping:
    jax.config.update("jax_enable_recoverability", True)
if args.count > 1:
    jax.distributed.initialize(
        f"127.0.0.1:{args.port}", num_processes=args.count, process_id=args.process, heartbeat_timeout_seconds=10
    )

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from leaving import leave_once_every_process_reported  # noqa: E402

import jaxstow  # noqa: E402
from jaxstow._read import broadcast  # noqa: E402

ROWS, COLUMNS = 512, 256
VALUES = {
    "rows": np.arange(ROWS * COLUMNS, dtype=np.float32).reshape(ROWS, COLUMNS),
    "rep": np.random.default_rng(7).standard_normal((ROWS, COLUMNS)).astype(np.float32),
}


class Loader:
    """A data iterator with grain's protocol: its state is bytes."""

    def __init__(self, position: int) -> None:
        self.position = position

    def get_state(self) -> bytes:
        return json.dumps({"position": self.position}).encode()

    def set_state(self, state: bytes) -> None:
        self.position = json.loads(state)["position"]


def shardings() -> dict[str, NamedSharding]:
    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    return {"rows": NamedSharding(mesh, P("x")), "rep": NamedSharding(mesh, P())}


def restore_shardings() -> dict[str, NamedSharding]:
    devices = len(jax.devices())
    mesh = jax.make_mesh((devices // 2, 2) if devices > 1 else (1, 1), ("data", "model"))
    return {"rows": NamedSharding(mesh, P("model")), "rep": NamedSharding(mesh, P())}


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
            rows = lines.read().splitlines()[1:]
        for line in rows:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                found.add(fields[9])
    return found


def bytes_read() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def leave(report: dict) -> None:
    """Prints the report and ends the process without jax's shutdown barrier, which a dead or stopped process would
    hold up; process 0, which runs jax's coordination service, waits until every other live process has reported."""
    print(json.dumps(report), flush=True)
    if args.count == 1:
        os._exit(0)
    leave_once_every_process_reported(
        args.process, args.count, gone=frozenset({args.die, args.stop, args.stop_after_gather})
    )


report: dict = {"process": args.process}
if args.count > 1 and args.collectives != "none":  # jax's own collectives (gloo) listen on a socket of their own
    multihost_utils.sync_global_devices("collectives ready")
before_listening = listening()
if args.chunk_bytes:
    broadcast.CHUNK_BYTES = args.chunk_bytes
if args.action == "save":
    state = {
        name: jax.make_array_from_callback(VALUES[name].shape, sharding, lambda i, name=name: VALUES[name][i])
        for name, sharding in shardings().items()
    }
    state["loader"] = jaxstow.per_process({"process": args.process, "seen": np.arange(args.process + 2)})
    state["it"] = Loader(10 * args.process + 1)
    with jaxstow.CheckpointManager(args.folder, process_timeout=args.process_timeout) as manager:
        manager.save(1, {"state": state})
        manager.wait()
        report["steps"] = manager.steps()
        report["listening"] = sorted(listening() - before_listening)
else:
    if args.process in (args.die, args.stop):

        def die(*arguments, **options):
            os.kill(os.getpid(), signal.SIGKILL if args.process == args.die else signal.SIGSTOP)

        broadcast.Exchange.share = die
    if args.process == args.stop_after_gather:
        gather = broadcast.Exchange._gather

        def gather_and_stop(*arguments, **options):
            gather(*arguments, **options)
            os.kill(os.getpid(), signal.SIGSTOP)

        broadcast.Exchange._gather = gather_and_stop
    shardings_ = restore_shardings()
    like = {name: jax.ShapeDtypeStruct(VALUES[name].shape, np.float32, sharding=s) for name, s in shardings_.items()}
    like["loader"], like["it"] = jaxstow.per_process(None), Loader(-1)
    forced = args.broadcast == "on"
    with jaxstow.CheckpointManager(
        args.folder, process_timeout=args.process_timeout, broadcast_restore=forced
    ) as manager:
        before, start = bytes_read(), time.monotonic()
        try:
            restored = manager.restore(like={"state": like})["state"]
        except jaxstow.errors.RequestError as error:  # another process count
            report["error"] = f"{type(error).__name__}: {error}"
            restored = manager.restore(like={"state": like}, per_process="all")["state"]
        except jaxstow.errors.JaxstowError as error:
            report.update(error=f"{type(error).__name__}: {error}", seconds=time.monotonic() - start)
            leave(report)
        report["seconds"] = time.monotonic() - start
        report["bytes_read"] = bytes_read() - before
        report["listening"] = sorted(listening() - before_listening)
    for name in VALUES:
        assert restored[name].sharding == shardings_[name], name
        for shard in restored[name].addressable_shards:
            assert np.array_equal(np.asarray(shard.data), VALUES[name][shard.index]), name
    if "error" not in report:  # the default: where it pays
        with jaxstow.CheckpointManager(args.folder, process_timeout=args.process_timeout) as manager:
            before = bytes_read()
            again = manager.restore(like={"state": like})["state"]
            report["default_bytes_read"] = bytes_read() - before
        for name in VALUES:
            for shard in again[name].addressable_shards:
                assert np.array_equal(np.asarray(shard.data), VALUES[name][shard.index]), name
    loader = restored["loader"]
    report["loader"] = [loader] if isinstance(loader, dict) else loader
    report["loader"] = [{"process": v["process"], "seen": v["seen"].tolist()} for v in report["loader"]]
    report["it"] = restored["it"].position if restored["it"] is like["it"] else [json.loads(s) for s in restored["it"]]
if stopping:
    leave(report)
print(json.dumps(report), flush=True)
if args.count > 1:
    jax.distributed.shutdown()
sys.exit(0)
