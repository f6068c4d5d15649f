"""The checkpoints of a step's chains, a file each, committed together: a crash between two of their writes leaves
every chain at one step, never some at the new step and some at the one before (a run resumed from those would give
the chains behind fewer draws than the others, silently).

Each chain's new checkpoint is written beside its file (``.next``); once all are written, a mark naming the chains
says the step is complete, the new files take the old ones' place and the mark goes. Before a chain's checkpoint is
read, :func:`settle` finishes a commit that a crash cut short after the mark, or forgets one cut short before it.

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> paths = {0: os.path.join(folder, "chain_0.ckpt"), 1: os.path.join(folder, "chain_1.ckpt")}
>>> commit_chains(paths, lambda chain_id, path: open(path, "w").write(f"step 10 of chain {chain_id}"))
>>> sorted(os.listdir(folder)), open(paths[1]).read()
(['chain_0.ckpt', 'chain_1.ckpt'], 'step 10 of chain 1')
>>> _ = open(paths[0] + ".next", "w").write("step 15, cut short before its mark")
>>> settle(0, paths[0]); open(paths[0]).read()
'step 10 of chain 0'
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping

from jaxstow._storage.atomic import atomic_write, fsync_directory
from jaxstow._storage.failures import storage_error
from jaxstow.errors import StorageError

__all__ = ["commit_chains", "settle"]

_NEXT = ".next"
_MARK = ".commit"


def commit_chains(paths: Mapping[int, str], write: Callable[[int, str], object]) -> None:
    """Write each chain's checkpoint with ``write(chain_id, path)`` and commit them together at ``paths``."""
    folder = os.path.dirname(next(iter(paths.values())))
    mark = os.path.join(folder, f"chains_{min(paths)}-{max(paths)}{_MARK}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(mark)  # of a step before, whose files are all in place
    try:
        for chain_id, path in paths.items():
            try:
                write(chain_id, path + _NEXT)
            except StorageError as error:  # named as the chain's checkpoint, not the name it is written under
                raise storage_error(error, path) from error
        with atomic_write(mark) as out:
            out.write(json.dumps(sorted(paths)).encode())
    except BaseException:  # the step is not committed: the files written for it go (a full disk keeps its space)
        for path in paths.values():
            with contextlib.suppress(OSError):
                os.unlink(path + _NEXT)
        raise
    for path in paths.values():
        os.replace(path + _NEXT, path)
    fsync_directory(folder)
    os.unlink(mark)


def settle(chain_id: int, path: str) -> None:
    """Finish or forget a commit of the chain's checkpoint at ``path`` that a crash cut short."""
    pending = path + _NEXT
    if not os.path.exists(pending):
        return
    folder = os.path.dirname(path) or "."
    marks = [os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(_MARK)]
    if any(chain_id in _marked(mark) for mark in marks):
        os.replace(pending, path)  # every chain of its step was written
    else:
        os.unlink(pending)


def _marked(mark: str) -> list[int]:
    try:
        with open(mark, "rb") as file:
            chains = json.loads(file.read())
    except (OSError, ValueError, RecursionError):
        return []
    return [chain for chain in chains if isinstance(chain, int)] if isinstance(chains, list) else []
