"""One process of a ``jax.distributed`` run that saves to two tiers: ``tier_worker.py ACTION PROCESS COUNT PORT BASE``.

Process ``k``'s local directory is ``BASE/local{k}`` and its host ``host{k // 2}`` (two processes per host); the
persistent directory is ``BASE/persistent`` (or ``--directory``, a URL with options in ``JAXSTOW_STORAGE_OPTIONS``).
``save`` saves steps 1 to 6 (every step locally, every 4th persistently), prints a line and waits to be killed
(SIGKILL, mid-run), as process 0 always does; ``restore`` restores the newest step restorable and checks every value
it holds; ``resume`` asks :meth:`should_save` about steps 1 to 8 (or ``--until``) without restoring, saves the
steps it picks and reports them; ``delete`` deletes the newest step, then restores the newest one left. ``train`` is a run that goes on
after a restart: it restores the newest step restorable (checking every
value), prints it, then saves every step due from the next one on, printing a line per save, until it is killed.
``--stop save`` makes process ``--victim`` stop itself (SIGSTOP) as it begins sending its copies of step 2 to its
peers, ``--stop copy`` as it begins copying step 4 to the persistent directory, ``--stop fetch`` as it begins sending
a replaced process its files. Each prints one JSON line of what it saw (with the warnings jaxstow logged).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("action", choices=["save", "restore", "resume", "train", "delete"])
parser.add_argument("process", type=int)
parser.add_argument("count", type=int)
parser.add_argument("port", type=int)
parser.add_argument("base")
parser.add_argument("--directory")
parser.add_argument("--timeout", type=float, default=30.0)
parser.add_argument("--stop", choices=["save", "copy", "fetch"])
parser.add_argument("--victim", type=int, default=2)
parser.add_argument("--step", type=int, help="the step restore restores (the newest restorable one by default)")
parser.add_argument("--expect", type=int, help="the step whose values restore expects (the step restored's)")
parser.add_argument("--until", type=int, default=8, help="the last step resume asks about")
args = parser.parse_args()
os.environ["JAXSTOW_HOST_NAME"] = f"host{args.process // 2}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    f"127.0.0.1:{args.port}", num_processes=args.count, process_id=args.process, heartbeat_timeout_seconds=120
)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager, LocalTier  # noqa: E402
from jaxstow.checkpoint import peer_copies, tiers  # noqa: E402
from jaxstow.errors import StepNotFoundError  # noqa: E402

ROWS, COLUMNS = 64, 48
MESH = jax.make_mesh((args.count,), ("x",))
SHARDINGS = {"w": NamedSharding(MESH, P("x")), "r": NamedSharding(MESH, P())}
OPTIONS = json.loads(os.environ.get("JAXSTOW_STORAGE_OPTIONS", "null"))


def expected(step: int) -> dict[str, np.ndarray]:
    w = np.random.default_rng(step).standard_normal((ROWS, COLUMNS)).astype(np.float32)
    return {"w": w, "r": w[0] * 3}


def state(step: int) -> dict:
    values = expected(step)
    return {
        name: jax.make_array_from_callback(values[name].shape, sharding, lambda index, name=name: values[name][index])
        for name, sharding in SHARDINGS.items()
    }


def stopping(method, step):
    def stop_first(self, *positional, **named):
        if args.stop == "fetch" or any(getattr(value, "step", value) == step for value in positional):
            print(json.dumps({"process": args.process, "stopping": True}), flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return method(self, *positional, **named)

    return stop_first


if args.stop == "copy" and args.process == args.victim:
    tiers.Tiers.copy_to = stopping(tiers.Tiers.copy_to, 4)
elif args.stop is not None and args.process == args.victim:
    name = "exchange" if args.stop == "save" else "gather_step"
    setattr(peer_copies.PeerCopies, name, stopping(getattr(peer_copies.PeerCopies, name), 2))


def restore_checked() -> int:
    """Restore the newest step restorable and check every value this process holds; its step."""
    like = {
        "params": {
            name: jax.numpy.zeros(value.shape, value.dtype, device=SHARDINGS[name])
            for name, value in expected(0).items()
        }
    }
    restored = manager.restore(args.step, like=like)
    step = manager.restored.step
    for name, want in expected(step if args.expect is None else args.expect).items():
        for shard in restored["params"][name].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), want[shard.index])
    return step


def train() -> None:
    """Restore (or start at step 1), then save every step due, a line each, until killed."""
    try:
        start = restore_checked() + 1
        print(json.dumps({"process": args.process, "restored": start - 1}), flush=True)
    except StepNotFoundError:
        start = 1
        print(json.dumps({"process": args.process, "restored": None}), flush=True)
    for step in range(start, start + 1000):
        if manager.should_save(step):
            manager.save(step, {"params": state(step)})
            print(json.dumps({"process": args.process, "saved": step}), flush=True)
        time.sleep(0.02)


manager = CheckpointManager(
    args.directory or os.path.join(args.base, "persistent"),
    save_every=4,
    local=LocalTier(os.path.join(args.base, f"local{args.process}"), keep_last=2),
    process_timeout=args.timeout,
    storage_options=OPTIONS,
)
report: dict = {"process": args.process, "warnings": []}


class Warnings(logging.Handler):
    """The warnings jaxstow logs, kept for the report."""

    def emit(self, record: logging.LogRecord) -> None:
        report["warnings"].append(record.getMessage())


logging.getLogger("jaxstow").addHandler(Warnings(logging.WARNING))
start = time.monotonic()
try:
    if args.action in ("save", "resume"):
        report["picked"] = []
        for step in range(1, 7 if args.action == "save" else args.until + 1):
            if manager.should_save(step):
                manager.save(step, {"params": state(step)})
                report["picked"].append(step)
        manager.wait()
        report.update(local=manager.steps(tier="local"), persistent=manager.steps(tier="persistent"))
    elif args.action == "train":
        train()
    elif args.action == "delete":
        manager.delete(manager.latest_step())
        report.update(restored=restore_checked(), local=manager.steps(tier="local"))
    else:
        report.update(restored=restore_checked(), local=manager.steps(tier="local"))
except Exception as error:
    report["error"] = f"{type(error).__name__}: {error}"
report["seconds"] = time.monotonic() - start
print(json.dumps(report), flush=True)
if (args.action == "save" and "error" not in report) or args.process == 0:
    time.sleep(120)  # killed here; process 0 hosts the coordination service the others may still use
os._exit(0)
