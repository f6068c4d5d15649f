"""orbax's checkpoints read through orbax: a checkpoint folder, a step of a ``CheckpointManager``, a manager's steps.

A pytree is restored with an abstract target built from its own metadata, every array on this process's first CPU
device; JSON items are read as JSON, and orbax's warnings kept out of the caller's output. Needs orbax
(``pip install 'jaxstow[orbax]'``).

>>> import os, tempfile, numpy as np, orbax.checkpoint as ocp
>>> from jaxstow._read.orbax_steps import manager_steps, read_step
>>> folder = os.path.join(tempfile.mkdtemp(), "run")
>>> options = ocp.CheckpointManagerOptions(best_fn=lambda metrics: metrics["loss"], best_mode="min")
>>> with ocp.CheckpointManager(folder, options=options) as manager:
...     manager.save(3, args=ocp.args.StandardSave({"w": np.ones(2, np.float32)}), metrics={"loss": 0.5})
...     manager.wait_until_finished()
True
>>> manager_steps(folder)
[(3, '3')]
>>> read_step(os.path.join(folder, "3"))
({'w': array([1., 1.], dtype=float32)}, {'loss': 0.5})
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from jaxstow._util.optional import require
from jaxstow.errors import FormatError, excerpt

__all__ = ["manager_steps", "quiet", "read_checkpoint", "read_step", "step_number"]

_PYTREE_HANDLERS = ("StandardCheckpointHandler", "PyTreeCheckpointHandler")
_JSON_HANDLERS = ("JsonCheckpointHandler",)
_STEP_NAME = re.compile(r"(?:.+_)?(\d+)")
_METRICS_ITEM = "metrics"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No warning or log line of another library (orbax, absl) reaches the output while the block runs."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        absl.setLevel(level)


def read_checkpoint(path: str) -> Any:
    """The pytree of an orbax checkpoint folder, with numpy arrays (of their own memory, writable) and Python scalars
    as leaves."""
    ocp = require("orbax.checkpoint", extra="orbax", purpose=f"reading the orbax checkpoint {path}")
    import jax

    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    with quiet():
        checkpointer = ocp.PyTreeCheckpointer()
        try:
            metadata = checkpointer.metadata(path)
            tree = getattr(getattr(metadata, "item_metadata", metadata), "tree", None)
            if tree is None:
                raise ValueError("it has no tree metadata")
            scalars = jax.tree.map(lambda leaf: type(leaf).__name__ == "ScalarMetadata", tree)
            shaped = jax.ShapeDtypeStruct
            abstract = jax.tree.map(
                lambda leaf: shaped(leaf.shape, leaf.dtype, sharding=cpu) if _is_array(leaf) else leaf,  # type: ignore[no-untyped-call]
                tree,
            )
            restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
            restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(abstract, restore_args=restore_args))
        except (FileNotFoundError, ValueError, KeyError, TypeError) as error:
            raise FormatError(f"not an orbax checkpoint that orbax can restore ({error})", file=path) from None
    return jax.tree.map(lambda leaf, scalar: np.asarray(leaf).item() if scalar else np.array(leaf), restored, scalars)


def _is_array(leaf: Any) -> bool:
    return getattr(leaf, "shape", None) is not None and getattr(leaf, "dtype", None) is not None


def read_step(path: str) -> tuple[Any, Any]:
    """Every item of a step of orbax's ``CheckpointManager`` by name, and the step's metrics.

    Items are pytrees or JSON; the metrics ``None`` if it has none. A step of the one item ``default`` gives that item's
    tree, as orbax's ``restore`` does.
    """
    try:
        with open(os.path.join(path, "_CHECKPOINT_METADATA"), "rb") as file:
            handlers = json.loads(file.read()).get("item_handlers")
    except (OSError, ValueError, AttributeError) as error:
        raise FormatError(f"not a step of an orbax CheckpointManager ({error})", file=path) from None
    if not isinstance(handlers, dict):
        raise FormatError("not a step of an orbax CheckpointManager: it names no items", file=path)
    items, metrics = {}, None
    for name, handler in sorted(handlers.items()):
        kind = str(handler).rpartition(".")[2]
        where = os.path.join(path, name)
        if kind in _JSON_HANDLERS:
            value = _read_json_item(where)
            if name == _METRICS_ITEM:
                metrics = value
            else:
                items[name] = value
        elif kind in _PYTREE_HANDLERS:
            items[name] = read_checkpoint(where)
        else:
            raise FormatError(
                f"item {excerpt(name)} is saved by orbax's {kind}, which jaxstow does not read", file=path
            )
    return (items["default"] if list(items) == ["default"] else items), metrics


def _read_json_item(folder: str) -> Any:
    """The JSON an orbax JSON item holds (its one file besides the commit marker)."""
    names = [name for name in sorted(os.listdir(folder)) if name != "commit_success.txt"]
    if len(names) != 1:
        raise FormatError(f"a JSON item holds one file, not {names}", file=folder)
    try:
        with open(os.path.join(folder, names[0]), "rb") as file:
            return json.loads(file.read())
    except (OSError, ValueError) as error:
        raise FormatError(f"the JSON item cannot be read ({error})", file=folder) from None


def step_number(name: str) -> int | None:
    """The step a folder of an orbax ``CheckpointManager`` holds, from its name (``12``, ``ckpt_12``)."""
    match = _STEP_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def manager_steps(path: str) -> list[tuple[int, str]]:
    """The committed steps of an orbax ``CheckpointManager`` folder: (step, folder name), oldest first."""
    steps = []
    for name in os.listdir(path):
        step = step_number(name)
        if step is not None and os.path.isfile(os.path.join(path, name, "_CHECKPOINT_METADATA")):
            steps.append((step, name))
    return sorted(steps)
