"""What a save writes as a step: its items (named, or one tree), held on the host, and this process's file of each.

>>> import tempfile, numpy as np
>>> from jaxstow._steps.record import RECORD_NAME
>>> from jaxstow._storage.store import open_store
>>> from jaxstow._write.held import hold
>>> from jaxstow.checkpoint.writing import StepContent, split_items, write_items
>>> named, single = split_items({"params": {"w": np.ones(2)}})
>>> items = {name: hold(tree, copy=False, file=name) for name, tree in named.items()}
>>> staging = open_store(tempfile.mkdtemp(), marker=RECORD_NAME).stage("7", replace=False)
>>> content = StepContent(7, items, single, metrics=None, metadata=None)
>>> summary = write_items(staging, 0, content, what="step 7", bar=False)
>>> summary["step"], summary["files"]
(7, {'params': 'params.safetensors'})
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jaxstow._steps.record import Metrics
from jaxstow._storage.store import Staging
from jaxstow._write.held import HeldTree
from jaxstow._write.save_report import SaveReport
from jaxstow.errors import ArgumentError

__all__ = ["EXTENSION", "SINGLE_ITEM", "StepContent", "split_items", "write_items"]

#: The item name of a step saved as one tree rather than a dict of named items.
SINGLE_ITEM = "state"
#: The extension of every item file.
EXTENSION = ".safetensors"
_ITEM_NAME = re.compile(r"[A-Za-z0-9_-]+")
_LONGEST_ITEM = 200  # with the process's suffix, ".safetensors" and a temporary name's, within 255 bytes


def split_items(items: Any) -> tuple[dict[str, Any], bool]:
    """Named items (a plain dict with string keys) or one tree; the flag says which. A dict of another class (an
    ``OrderedDict``, whose leaves follow its order) is one tree: as named items it would come back a plain dict."""
    if not (type(items) is dict and all(isinstance(name, str) for name in items)):
        return {SINGLE_ITEM: items}, True
    bad = [name for name in items if not _ITEM_NAME.fullmatch(name)]
    if bad:
        raise ArgumentError(
            f"item names become file names, so they may hold only letters, digits, '_' and '-'; {bad!r} do not "
            "(to save a dict with such keys as one tree, wrap it: save(step, {'state': tree}))"
        )
    if long := [name for name in items if len(name) > _LONGEST_ITEM]:
        raise ArgumentError(
            f"item names become file names, which file systems keep short: {len(long[0])} characters are more than "
            f"the {_LONGEST_ITEM} an item name may have ({long[0][:40]!r}...); give it a shorter name"
        )
    return dict(items), False


@dataclass(frozen=True)
class StepContent:
    """What one save writes as a step: its items held on the host, whether they are one tree, metrics and metadata,
    and the keep policy in force (as its record holds it)."""

    step: int
    held: dict[str, HeldTree]
    single: bool
    metrics: Metrics | None
    metadata: dict[str, Any] | None
    keep_policy: dict[str, Any] | None = None


def write_items(staging: Staging, me: int, content: StepContent, *, what: str, bar: bool) -> dict[str, Any]:
    """Write process ``me``'s file of each item of ``content`` into ``staging`` (``item.safetensors`` from process 0,
    ``item.p{me}.safetensors`` from the others), reported as ``what`` (a progress bar if ``bar``); its summary: the
    step, the files as stored, the trees' digests and replicas' prints, and the files' header checksums."""
    encoded = {name: item.encode() for name, item in content.held.items()}
    report = SaveReport(what, total=sum(tree.nbytes for tree in encoded.values()), bar=bar)
    files, digests, replicas, headers = {}, {}, {}, {}
    for name, tree in encoded.items():
        with staging.open(f"{name}{f'.p{me}' if me else ''}{EXTENSION}") as (stored, sink):
            header = tree.write(report.sink(sink))
        files[name], digests[name], replicas[name] = stored, tree.digest, tree.replicas
        if header is not None:
            headers[stored] = header
    report.finish()
    return {"step": content.step, "files": files, "digests": digests, "replicas": replicas, "headers": headers}
