"""orbax's checkpoints read through orbax: a checkpoint folder, a step of a ``CheckpointManager``, a manager's steps.

A pytree is restored as numpy, every array and scalar in the dtype its own metadata records (never narrowed by jax's
x64 mode), typed PRNG keys wrapped again; JSON items are read as JSON, and orbax's warnings kept out of the caller's
output. Needs orbax
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
import itertools
import json
import logging
import math
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from jaxstow._format.keypaths import path_to_str
from jaxstow._read.orbax_files import check_folder, read_json_file
from jaxstow._storage.failures import storage_error
from jaxstow._storage.member_names import is_member_name
from jaxstow._util.host_memory import usable_memory
from jaxstow._util.optional import require
from jaxstow.errors import FormatError, PathError, excerpt

__all__ = ["key_impls", "manager_steps", "quiet", "read_checkpoint", "read_step", "step_number"]

_PYTREE_HANDLERS = ("StandardCheckpointHandler", "PyTreeCheckpointHandler")
_JSON_HANDLERS = ("JsonCheckpointHandler",)
_STEP_NAME = re.compile(r"(?:.+_)?([0-9]+)")
_METRICS_ITEM = "metrics"
#: orbax's metadata of the leaves read as numpy: arrays and scalars.
_NUMERIC_METADATA = ("ArrayMetadata", "ScalarMetadata")


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
    """The pytree of an orbax checkpoint folder, with numpy arrays (writable) and Python scalars and strings as leaves.

    Every array and scalar is read as numpy in the dtype it was saved with, whatever jax's x64 mode: an int64 beyond 32
    bits, a float64, a uint64 or a complex128 comes back exact (jaxstow's own check refuses what jax would narrow, on
    the way to jax). A typed PRNG key comes back a key, its key data wrapped with the implementation orbax recorded.

    >>> import os, tempfile, numpy as np, orbax.checkpoint as ocp
    >>> from jaxstow._read.orbax_steps import read_checkpoint
    >>> folder = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> with ocp.PyTreeCheckpointer() as checkpointer:
    ...     checkpointer.save(folder, {"step": np.array([2**40 + 1], np.int64), "n": 2**40 + 1, "name": "run"})
    >>> read_checkpoint(folder)
    {'n': 1099511627777, 'name': 'run', 'step': array([1099511627777])}
    """
    ocp = require("orbax.checkpoint", extra="orbax", purpose=f"reading the orbax checkpoint {path}")
    import jax

    if os.path.isdir(path):
        check_folder(path)
    with quiet():
        checkpointer = ocp.PyTreeCheckpointer()
        try:
            metadata = checkpointer.metadata(path)
            tree = getattr(getattr(metadata, "item_metadata", metadata), "tree", None)
            if tree is None:
                raise ValueError(_why_no_tree(ocp, path))
            _check_fits(jax.tree.leaves(tree), path)
            restore_args = jax.tree.map(lambda leaf: _restore_arg(ocp, leaf), tree)
            restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
        except FormatError:
            raise
        # Metadata that is not orbax's, or that orbax cannot rebuild (an AssertionError), or names tensorstore cannot
        # take (a RuntimeError of its bindings)
        except (
            FileNotFoundError,
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            AssertionError,
            RuntimeError,
        ) as error:
            shown = f"{type(error).__name__}: {error}" if isinstance(error, AssertionError | RuntimeError) else error
            raise FormatError(f"not an orbax checkpoint that orbax can restore ({shown})", file=path) from None
        except OSError as error:
            raise storage_error(error, path, doing="read it") from error
    impls = key_impls(path)
    return jax.tree_util.tree_map_with_path(
        lambda key_path, leaf, meta: _leaf(leaf, meta, impls, path=path, where=path_to_str(key_path)), restored, tree
    )


def _why_no_tree(ocp: Any, path: str) -> str:
    """Why orbax found no tree in the checkpoint at ``path``: the error its handler's metadata raises, which the
    checkpointer's keeps to itself (an array's ``.zarray`` missing or unreadable), without tensorstore's spec."""
    from etils import epath

    try:
        ocp.PyTreeCheckpointHandler().metadata(epath.Path(path))
    except Exception as error:  # orbax's and tensorstore's errors, whatever their kind: the reason, shown
        return str(error).split(" [tensorstore_spec=")[0]
    return "it has no tree metadata"


def _check_fits(leaves: list[Any], path: str) -> None:
    """Refuse a checkpoint whose metadata claims more bytes of arrays than the memory this process may use (a
    container's or ``ulimit -v``'s limit, else the machine's), before orbax allocates them: an allocation that large
    aborts the process (``std::bad_alloc``), whatever the files hold."""
    claimed = sum(
        math.prod(getattr(leaf, "shape", None) or ()) * np.dtype(leaf.dtype).itemsize
        for leaf in leaves
        if type(leaf).__name__ in _NUMERIC_METADATA and getattr(leaf, "dtype", None) is not None
    )
    memory = usable_memory()
    if claimed > memory:
        raise FormatError(
            f"its metadata claims {claimed} bytes of arrays, more than the {memory} bytes of memory this process may "
            "use to restore them into: a checkpoint of that size is read with orbax where memory holds it, "
            "and a folder that claims more than it holds is damaged or crafted",
            file=path,
        )


def _restore_arg(ocp: Any, leaf: Any) -> Any:
    """How orbax restores a leaf: an array or a scalar as numpy in its saved dtype (never a jax array, which x64 off
    would narrow), anything else (a string) as orbax's own handler reads it."""
    if type(leaf).__name__ in _NUMERIC_METADATA and getattr(leaf, "dtype", None) is not None:
        return ocp.RestoreArgs(restore_type=np.ndarray, dtype=np.dtype(leaf.dtype))
    return ocp.RestoreArgs()


def _leaf(leaf: Any, meta: Any, impls: dict[str, str], *, path: str, where: str) -> Any:
    """A restored leaf as jaxstow hands it on: a scalar as a Python number, an array as a writable numpy array, a
    typed PRNG key as a key, a string as ``str``."""
    kind = type(meta).__name__
    if isinstance(leaf, np.ndarray | np.generic) and leaf.dtype.kind in "US":  # a string in numpy's clothes
        return str(leaf.item() if leaf.dtype.kind == "U" else leaf.item().decode("utf-8", "replace"))
    if kind == "ScalarMetadata" and isinstance(leaf, np.ndarray | np.generic):
        if np.size(leaf) != 1:
            raise FormatError(
                f"its metadata calls the leaf a scalar, and it holds an array of shape {np.shape(leaf)}: the metadata "
                "is damaged",
                file=path,
                path=where,
            )
        return np.asarray(leaf).item()
    if kind not in _NUMERIC_METADATA or not isinstance(leaf, np.ndarray):
        return leaf
    array = leaf if leaf.flags.writeable else np.array(leaf)
    impl = impls.get(str(getattr(meta, "name", "")))
    if impl is None:
        return array
    import jax

    try:
        return jax.random.wrap_key_data(jax.device_put(array), impl=impl)
    except (TypeError, ValueError) as error:
        raise FormatError(
            f"holds a PRNG key of implementation {excerpt(impl)} whose key data ({array.dtype}, shape "
            f"{array.shape}) jax cannot wrap here ({error}); restore it with orbax, or load it where jax knows that "
            "implementation",
            file=path,
            path=where,
        ) from None


def key_impls(path: str) -> dict[str, str]:
    """The PRNG key implementation orbax recorded for each typed key leaf of a checkpoint, by orbax's name of the leaf
    (``params.rng``): orbax writes a key as its key data and the implementation beside it, in ``array_metadatas``.

    Empty for a checkpoint without keys, or written by an orbax that recorded none.
    """
    from etils import epath

    folder = epath.Path(path) / "array_metadatas"
    impls: dict[str, str] = {}
    try:
        files = sorted(folder.iterdir()) if folder.exists() else []
        for file in files:
            found = json.loads(file.read_text()).get("array_metadatas")
            for item in found if isinstance(found, list) else ():
                entry = item.get("array_metadata") if isinstance(item, dict) else None
                if not isinstance(entry, dict):
                    continue
                extra, name = entry.get("ext_metadata"), entry.get("param_name")
                impl = extra.get("random_key_impl") if isinstance(extra, dict) else None
                if isinstance(impl, str) and isinstance(name, str):
                    impls[name] = impl
    except (OSError, ValueError, RecursionError, AttributeError) as error:
        raise FormatError(f"its array metadata cannot be read ({error})", file=path) from None
    return impls


def read_step(path: str) -> tuple[Any, Any]:
    """Every item of a step of orbax's ``CheckpointManager`` by name, and the step's metrics.

    Items are pytrees or JSON; the metrics ``None`` if it has none. A step of the one item ``default`` gives that item's
    tree, as orbax's ``restore`` does.
    """
    check_folder(path)
    try:
        with open(os.path.join(path, "_CHECKPOINT_METADATA"), "rb") as file:
            handlers = json.loads(file.read()).get("item_handlers")
    except (OSError, ValueError, RecursionError, AttributeError) as error:
        raise FormatError(f"not a step of an orbax CheckpointManager ({error})", file=path) from None
    if not isinstance(handlers, dict):
        raise FormatError("not a step of an orbax CheckpointManager: it names no items", file=path)
    for name in sorted(set(os.listdir(path)) - set(handlers)):
        if name == _METRICS_ITEM or os.path.isfile(os.path.join(path, name, "_METADATA")):
            raise FormatError(
                f"holds the item {excerpt(name)}, which its _CHECKPOINT_METADATA does not name (it names "
                f"{excerpt(sorted(handlers))}): orbax names every item it saves there, so the step is damaged",
                file=path,
            )
    items, metrics = {}, None
    for name, handler in sorted(handlers.items()):
        kind = str(handler).rpartition(".")[2]
        where = os.path.join(path, name)
        if not is_member_name(name) or not os.path.isdir(where):
            raise FormatError(
                f"names the item {excerpt(name)}, which is no folder of the step: orbax keeps each item in a folder "
                "of the step named after it",
                file=path,
            )
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
    data = read_json_file(os.path.join(folder, names[0]))
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:
        raise FormatError(f"the JSON item cannot be read ({error})", file=folder) from None


def step_number(name: str) -> int | None:
    """The step a folder of an orbax ``CheckpointManager`` holds, from its name (``12``, ``ckpt_12``)."""
    match = _STEP_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def manager_steps(path: str, *, every: bool = False) -> list[tuple[int, str]]:
    """The committed steps of an orbax ``CheckpointManager`` folder: (step, folder name), oldest first.

    ``every``: a folder named as a step is one, as orbax lists it, and one that cannot be read as a step is an error
    (a :class:`~jaxstow.errors.FormatError`, or a :class:`~jaxstow.errors.PathError` for a link that leads out of
    ``path``), never left out: a conversion holds every step orbax would restore.
    """
    steps = []
    for name in os.listdir(path):
        step, where = step_number(name), os.path.join(path, name)
        if step is None or not os.path.isdir(where):
            continue
        if every:
            _check_step(path, name, where)
        elif not os.path.isfile(os.path.join(where, "_CHECKPOINT_METADATA")):
            continue
        steps.append((step, name))
    steps.sort()
    for (step, name), (later, other) in itertools.pairwise(steps):
        if every and step == later:
            raise FormatError(
                f"holds step {step} twice, in the folders {excerpt(name)} and {excerpt(other)}: move one away",
                file=path,
            )
    return steps


def _check_step(path: str, name: str, where: str) -> None:
    """Refuse the step folder ``name`` of ``path`` (at ``where``) unless it is one of ``path`` that can be read."""
    if os.path.islink(where) and os.path.commonpath([os.path.realpath(where), os.path.realpath(path)]) != (
        os.path.realpath(path)
    ):
        raise PathError(
            f"is a link to {os.path.realpath(where)}, outside the orbax folder {path}: its steps are read only within "
            "it; copy the step into the folder if you trust it",
            file=where,
        )
    if not name.isprintable():  # bytes that are no UTF-8 text come as lone surrogates, which are not printable
        raise FormatError(
            "is a step folder whose name is no printable UTF-8 text: rename it, or move it away", file=where
        )
    if not os.path.isfile(os.path.join(where, "_CHECKPOINT_METADATA")):
        raise FormatError(
            "is a step folder without its _CHECKPOINT_METADATA, which orbax writes with every step: the step is "
            "damaged, or was written by an orbax too old to read here; move it away to convert the other steps",
            file=where,
        )
