"""One process of a ``jax.distributed`` run, started by the multi-process tests: ``worker.py ACTION PROCESS COUNT
DEVICES PORT FOLDER``.

``save`` saves steps 1 and 2 of a tree sharded over a global mesh of every process's devices (with
``--pause-before-commit``, a pause between them, announced by a line, for a signal); ``restore`` restores step 1, then
step 2 on a mesh of this run's devices (or, in one process with ``--no-target``, whole arrays on one CPU) and checks
every value (with ``--pause-before-restore``, a pause between them, announced by a line; with ``--fallback``, the
newest intact step); ``disagree`` saves another
step in process 1, ``other-tree`` another tree, ``other-layout`` its arrays on a mesh of the devices in reverse order. ``--stall K`` makes process K pause for a minute instead, alive but
silent; ``--slow-writes S`` makes process 0's files of step 2 take S seconds longer to write (a slow disk); ``--recoverable`` sets ``jax_enable_recoverability``, so that a dead peer does not end the others.
Each prints one JSON line of what it saw (with ``seconds``, the time the save or restore of step 2 took, and ``error``
if it failed). ``FOLDER`` may be a URL, with fsspec options as JSON in ``JAXSTOW_STORAGE_OPTIONS``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("action", choices=["save", "restore", "disagree", "other-tree", "other-layout"])
parser.add_argument("process", type=int)
parser.add_argument("count", type=int)
parser.add_argument("devices", type=int)
parser.add_argument("port", type=int)
parser.add_argument("folder")
parser.add_argument("--no-target", action="store_true")
parser.add_argument("--pause-before-commit", type=float, default=0.0)
parser.add_argument("--pause-before-restore", type=float, default=0.0)
parser.add_argument("--stall", type=int, default=-1)
parser.add_argument("--slow-writes", type=float, default=0.0)
parser.add_argument("--process-timeout", type=float, default=30.0)
parser.add_argument("--heartbeat", type=int, default=10)
parser.add_argument("--recoverable", action="store_true")
parser.add_argument("--fallback", action="store_true")
args = parser.parse_args()
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if args.recoverable:
    jax.config.update("jax_enable_recoverability", True)
if args.count > 1:
    jax.distributed.initialize(
        f"127.0.0.1:{args.port}",
        num_processes=args.count,
        process_id=args.process,
        heartbeat_timeout_seconds=args.heartbeat,
    )

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

ROWS, COLUMNS = 512, 384
OPTIONS = json.loads(os.environ.get("JAXSTOW_STORAGE_OPTIONS", "null"))


def expected(step: int) -> dict[str, np.ndarray]:
    """The values saved at ``step``: the same in every process, whatever the layout."""
    base = np.arange(ROWS * COLUMNS, dtype=np.float32).reshape(ROWS, COLUMNS) + 1000 * step
    return {"w": base, "b": base[0] * 2, "r": base[:8, 0].copy(), "count": np.int32(step)}


def global_mesh(reverse: bool = False) -> jax.sharding.Mesh:
    count = len(jax.devices())
    shape = (2, count // 2) if count % 2 == 0 else (1, count)
    if reverse:  # the same shape and axes, its devices in another order: another layout of the same arrays
        return jax.sharding.Mesh(np.array(jax.devices()[::-1]).reshape(shape), ("data", "model"))
    return jax.make_mesh(shape, ("data", "model"))


def layouts(mesh: jax.sharding.Mesh) -> dict[str, NamedSharding]:
    return {
        "w": NamedSharding(mesh, P("data", "model")),  # every shard distinct
        "b": NamedSharding(mesh, P("model")),  # partially replicated
        "r": NamedSharding(mesh, P()),  # replicated everywhere
    }


def sharded_state(step: int, reverse: bool = False) -> dict:
    values, shardings = expected(step), layouts(global_mesh(reverse))
    state = {
        name: jax.make_array_from_callback(
            values[name].shape, shardings[name], lambda index, name=name: values[name][index]
        )
        for name in shardings
    }
    return {"params": state, "meta": {"count": values["count"]}}


def pause(seconds: float, what: str) -> None:
    """Announce ``what`` was done, then pause (a minute, in the process that stalls)."""
    if seconds or args.stall >= 0:
        print(json.dumps({"process": args.process, **{what: 1}}), flush=True)
        time.sleep(60 if args.process == args.stall else seconds)


def leave() -> None:
    """End without jax's shutdown barrier, which a stopped or dead process would hold up; process 0, which hosts
    the coordination service, stays a while so that the others can still receive what it sent."""
    if args.process == 0:
        time.sleep(30)
    os._exit(0)


def bytes_read() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


report: dict = {"process": args.process}
if args.action in ("save", "disagree", "other-tree", "other-layout"):
    with CheckpointManager(args.folder, process_timeout=60, storage_options=OPTIONS) as manager:
        manager.save(1, sharded_state(1))  # processes start at different times: no short timeout yet
        manager.wait()
    pause(args.pause_before_commit, "saved")
    with CheckpointManager(args.folder, process_timeout=args.process_timeout, storage_options=OPTIONS) as manager:
        step = 3 if args.action == "disagree" and args.process == 1 else 2
        start = time.monotonic()
        if args.slow_writes and args.process == 0:  # a slow disk: its files take longer than the others' timeouts
            import jaxstow.checkpoint.shared as shared

            write_items = shared.write_items
            shared.write_items = lambda *a, **k: (time.sleep(args.slow_writes), write_items(*a, **k))[1]  # type: ignore[attr-defined]
        try:
            state = sharded_state(2, reverse=args.action == "other-layout" and args.process == 1)
            if args.action == "other-tree" and args.process == 1:
                state["meta"]["extra"] = np.float32(1)
            manager.save(step, state)
            manager.wait()
            report["steps"] = manager.steps()
        except Exception as error:
            report["error"] = f"{type(error).__name__}: {error}"
        report["seconds"] = time.monotonic() - start
else:
    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    target = {
        "params": {
            "w": NamedSharding(mesh, P("x")) if ROWS % len(jax.devices()) == 0 else None,
            "b": NamedSharding(mesh, P()),
            "r": NamedSharding(mesh, P("x")) if 8 % len(jax.devices()) == 0 else None,
        },
        "meta": None,
    }
    with CheckpointManager(args.folder, process_timeout=60, storage_options=OPTIONS) as manager:
        manager.restore(1, sharding=None if args.no_target else target)  # every code path loaded before measuring
    pause(args.pause_before_restore, "restored")
    with CheckpointManager(args.folder, process_timeout=args.process_timeout, storage_options=OPTIONS) as manager:
        before = bytes_read()
        start = time.monotonic()
        try:
            state = manager.restore(sharding=None if args.no_target else target, fallback=args.fallback)
        except Exception as error:
            print(
                json.dumps(
                    {**report, "error": f"{type(error).__name__}: {error}", "seconds": time.monotonic() - start}
                ),
                flush=True,
            )
            leave()
        after = bytes_read()
    assert manager.restored is not None
    want = expected(manager.restored.step)
    held = 0
    for name in ("w", "b", "r"):
        array = state["params"][name]
        for shard in array.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), want[name][shard.index])
            held += shard.data.nbytes
        if args.no_target:
            assert len(array.devices()) == 1
            np.testing.assert_array_equal(np.asarray(array), want[name])
    assert int(state["meta"]["count"]) == manager.restored.step
    report.update(bytes_read=after - before, bytes_held=held, steps=manager.steps(), restored=manager.restored.step)
print(json.dumps(report), flush=True)
if "error" in report and args.stall >= 0:
    leave()
if args.count > 1:
    jax.distributed.shutdown()
sys.exit(0)
