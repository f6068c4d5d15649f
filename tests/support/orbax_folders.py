"""orbax checkpoints and runs made by orbax itself, for tests that then damage them, and ``jaxstow convert`` run in
a process of its own (a crash of tensorstore's takes only that process down)."""

from __future__ import annotations

import os
import sys
import warnings

import forked
import numpy as np
import orbax.checkpoint as ocp


def orbax_folder(folder, tree, *, ocdbt=False):
    """An orbax checkpoint of ``tree`` with a zarr folder per array, whose metadata can be edited (``ocdbt``: in an
    OCDBT database, orbax's default)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt)) as checkpointer:
            checkpointer.save(os.path.abspath(folder), args=ocp.args.PyTreeSave(tree))
    return folder


def orbax_run(folder, steps, metrics=None):
    """A folder of orbax's ``CheckpointManager`` holding ``steps``, each with ``{"w": [step] * 3}`` and the metrics
    ``metrics`` gives it (``{"loss": 1 / step}`` by default)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = ocp.CheckpointManagerOptions(best_fn=lambda metrics: 0.0)  # orbax writes metrics with a best_fn
        with ocp.CheckpointManager(os.path.abspath(folder), options=options) as manager:
            for step in steps:
                tree = {"w": np.full(3, step, np.int32)}
                given = {"loss": 1 / step} if metrics is None else metrics
                manager.save(step, args=ocp.args.StandardSave(tree), metrics=given)
            manager.wait_until_finished()
    return folder


def convert(src, dst):
    """``jaxstow convert SRC DST`` in a process of its own."""
    return forked.run(
        [sys.executable, "-m", "jaxstow", "convert", str(src), str(dst)], capture_output=True, text=True, timeout=300
    )
