"""One step written by one process: its items encoded, each written into the step's staging folder, then committed
with its record.

>>> import tempfile, numpy as np
>>> from jaxstow._steps.record import RECORD_NAME
>>> from jaxstow._storage.store import open_store
>>> from jaxstow._write.held import hold
>>> from jaxstow.checkpoint.writing import StepContent, split_items, write_step
>>> store = open_store(tempfile.mkdtemp(), marker=RECORD_NAME)
>>> named, single = split_items({"params": {"w": np.ones(2)}})
>>> items = {name: hold(tree, copy=False, file=name) for name, tree in named.items()}
>>> content = StepContent(7, items, single, metrics=None, metadata=None)
>>> write_step(store, "7", content, replace=False, keep_policy=None, progress=False).files
{'params': 'params.safetensors'}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jaxstow._steps.record import Metrics, StepRecord
from jaxstow._storage.store import Store
from jaxstow._write.held import HeldTree
from jaxstow._write.save_report import SaveReport
from jaxstow.errors import ArgumentError

__all__ = ["EXTENSION", "SINGLE_ITEM", "StepContent", "split_items", "write_step"]

#: The item name of a step saved as one tree rather than a dict of named items.
SINGLE_ITEM = "state"
#: The extension of every item file.
EXTENSION = ".safetensors"
_ITEM_NAME = re.compile(r"[A-Za-z0-9_-]+")


def split_items(items: Any) -> tuple[dict[str, Any], bool]:
    """Named items (a dict with string keys) or one tree; the flag says which."""
    if not (isinstance(items, dict) and all(isinstance(name, str) for name in items)):
        return {SINGLE_ITEM: items}, True
    bad = [name for name in items if not _ITEM_NAME.fullmatch(name)]
    if bad:
        raise ArgumentError(
            f"item names become file names, so they may hold only letters, digits, '_' and '-'; {bad!r} do not "
            "(to save a dict with such keys as one tree, wrap it: save(step, {'state': tree}))"
        )
    return dict(items), False


@dataclass(frozen=True)
class StepContent:
    """What one save writes as a step: its items held on the host, whether they are one tree, metrics and metadata."""

    step: int
    held: dict[str, HeldTree]
    single: bool
    metrics: Metrics | None
    metadata: dict[str, Any] | None


def write_step(
    store: Store,
    folder: str,
    content: StepContent,
    *,
    replace: bool,
    keep_policy: dict[str, Any] | None,
    progress: bool,
) -> StepRecord:
    """Encode and write every item of a step into its staging folder, then commit it with its record (written last);
    a failure removes the staging folder. Returns the committed record."""
    step = content.step
    encoded = {name: item.encode() for name, item in content.held.items()}
    total = sum(tree.nbytes for tree in encoded.values())
    report = SaveReport(f"step {step} of {store.location}", total=total, bar=progress)
    staging = store.stage(folder, replace=replace)
    try:
        files, headers = {}, {}
        for name, tree in encoded.items():
            with staging.open(name + EXTENSION) as (stored, sink):
                header = tree.write(report.sink(sink))
            files[name] = stored
            if header is not None:
                headers[stored] = header
        record = StepRecord(
            step, files, content.single, content.metrics, content.metadata, keep_policy=keep_policy, headers=headers
        )
        staging.commit(record.to_json())
    except BaseException:
        staging.abort()
        raise
    report.finish()
    return record
