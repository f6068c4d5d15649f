"""A process that forks writers on command, for the crash and concurrency probes (``python -m reliability.kill_target``).

It imports jaxstow once and never touches a jax device, so forking it is safe and a writer starts in a millisecond
instead of the seconds a fresh interpreter needs to import jax. Commands, one per line on stdin:

- ``save PATH FIRST``: a child saves ``tree(FIRST)``, ``tree(FIRST + 1)``, ... to PATH until it is killed; prints the
  child's pid, then ``reaped`` once it is gone.
- ``ckpt DIR FIRST``: the same with a :class:`~jaxstow.CheckpointManager` saving steps FIRST, FIRST + 1, ...
- ``race PATH FIRST COUNT``: two children each save COUNT versions to PATH at the same time; prints ``done``.
- ``lock DIR``: a child tries to save a step into DIR; prints ``refused`` if it got a CheckpointError.
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from typing import Any

import numpy as np

import jaxstow

#: Elements of each array of a saved tree: 4 arrays of 4 MiB, so that a save takes long enough to be interrupted.
SIZE = 1 << 20


def tree(version: int) -> dict[str, Any]:
    """The tree saved as ``version``: every array filled with it, so a torn file cannot pass for a whole one."""
    return {"version": version, **{f"w{i}": np.full(SIZE + i, version, np.float32) for i in range(4)}}


def is_whole(restored: Any) -> bool:
    """Whether ``restored`` is exactly ``tree(v)`` for the version ``v`` it names."""
    version = restored.get("version") if isinstance(restored, dict) else None
    if type(version) is not int or sorted(restored) != sorted(tree(0)):
        return False
    return all(np.array_equal(restored[f"w{i}"], np.full(SIZE + i, version, np.float32)) for i in range(4))


def _save_forever(path: str, first: int) -> None:
    for version in itertools.count(first):
        jaxstow.save(path, tree(version))


def _checkpoint_forever(directory: str, first: int) -> None:
    with jaxstow.CheckpointManager(directory, keep_last=2) as manager:
        for step in itertools.count(first):
            manager.save(step, {"params": tree(step)}, metrics={"loss": 1.0 / (1 + step)})
            manager.wait()


def _race(path: str, first: int, count: int) -> None:
    for version in range(first, first + count):
        jaxstow.save(path, tree(version))


def _try_to_lock(directory: str) -> None:
    try:
        with jaxstow.CheckpointManager(directory) as manager:
            manager.save(10**6, {"params": tree(0)})
    except jaxstow.errors.CheckpointError:
        os._exit(0)
    os._exit(1)


def _fork(job: Any, *args: Any) -> int:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            job(*args)
        finally:
            os._exit(0)
    return pid


def main() -> None:
    warnings.simplefilter("ignore")  # jax warns about fork; nothing here runs on a device
    for line in sys.stdin:
        command, *args = line.split()
        if command in ("save", "ckpt"):
            pid = _fork(_save_forever if command == "save" else _checkpoint_forever, args[0], int(args[1]))
            print(pid, flush=True)
            os.waitpid(pid, 0)
            print("reaped", flush=True)
        elif command == "race":
            first, count = int(args[1]), int(args[2])
            pids = [_fork(_race, args[0], first + k * count, count) for k in range(2)]
            for pid in pids:
                os.waitpid(pid, 0)
            print("done", flush=True)
        elif command == "lock":
            _, status = os.waitpid(_fork(_try_to_lock, args[0]), 0)
            print("refused" if os.waitstatus_to_exitcode(status) == 0 else "accepted", flush=True)


if __name__ == "__main__":
    main()
