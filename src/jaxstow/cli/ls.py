"""``jaxstow ls FOLDER``: the steps of a checkpoint folder, with their time, size, metrics and keep rules; or what a
Hugging Face folder of safetensors files holds (its shards, their tensors and sizes).

The keep rules are those of the manager that wrote the newest step (recorded in its ``checkpoint.json``).

>>> import tempfile, jax.numpy as jnp
>>> from jaxstow import CheckpointManager
>>> from jaxstow.cli import main
>>> folder = tempfile.mkdtemp()
>>> from jaxstow import KeepPolicy
>>> with CheckpointManager(folder, keep=KeepPolicy(keep_last=1, keep_best=1, metric="loss")) as manager:
...     for step, loss in [(1, 0.5), (2, 0.2), (3, 0.4)]:
...         manager.save(step, {"w": jnp.ones(4)}, metrics={"loss": loss})
>>> main(["ls", folder])
step  time                 size     metrics   kept by
   2  ...  4.11 kB  loss=0.2  best 1 by loss
   3  ...  4.11 kB  loss=0.4  last 1
2 steps, 8.22 kB; keep rules: keep_last=1, keep_best=1 by loss (min)
0
"""

from __future__ import annotations

import argparse
import datetime
import os
from typing import Any

from jaxstow._steps.keep import KeepPolicy
from jaxstow._util.progress import format_bytes
from jaxstow.checkpoint.recovery import is_damage
from jaxstow.cli.files import DamagedStep, Step, committed_steps, file_sizes, hf_listing, open_hf_folder
from jaxstow.cli.inspect import HF_FOLDER
from jaxstow.cli.output import Table, print_json, printable
from jaxstow.errors import JaxstowError

__all__ = ["HELP", "arguments", "keep_policy", "run"]


#: The line of ``jaxstow --help`` that names this command.
HELP = "the steps of a checkpoint folder: step, time, size, metrics, the keep rule that holds each"


def arguments(parser: argparse.ArgumentParser) -> None:
    """List the committed steps of a folder written by jaxstow.CheckpointManager: step, time, size, metrics, and which keep
    rule of the manager holds each step. Of a Hugging Face folder of safetensors files, say what it is and list its
    shards: tensors and size of each."""
    parser.add_argument(
        "folder", help="a checkpoint folder or a Hugging Face folder of safetensors files (a path or an fsspec URL)"
    )
    parser.add_argument("--json", action="store_true", help="print the steps as JSON, for scripts")


def run(args: argparse.Namespace) -> int:
    if hf_listing(args.folder) is not None:
        return _hf_folder(args)
    steps = committed_steps(args.folder)
    readable = [step for step in steps if isinstance(step, Step)]
    policy = keep_policy(readable[-1]) if readable else None
    metric = None if policy is None else policy.metric
    reasons = (
        {}
        if policy is None
        else policy.reasons(  # a damaged step ranks last and has no time, as the manager's prune sees it
            [step.step for step in steps],
            {step.step: step.record.metric(metric) for step in readable} if metric else {},
            {step.step: step.record.time for step in readable},
        )
    )
    rows = [row for step in steps if (row := _row(step, reasons.get(step.step))) is not None]
    damaged = [row for row in rows if row["damaged"] is not None]
    if args.json:
        print_json(
            {
                "folder": args.folder,
                "keep_policy": readable[-1].record.keep_policy if readable else None,
                "steps": rows,
            }
        )
        return 1 if damaged else 0
    table = Table(["step", "time", "size", "metrics", "kept by"], right=["step", "size"])
    for row in rows:
        when = "-" if row["time"] is None else _when(row["time"])
        metrics = " ".join(
            f"{name}={value:.6g}" if value is not None else f"{name}=nan" for name, value in row["metrics"].items()
        )
        kept = ", ".join(row["kept_by"]) if row["kept_by"] is not None else "-"
        size = "-" if row["bytes"] is None else format_bytes(row["bytes"])
        table.add(row["step"], when, size, "DAMAGED" if row["damaged"] is not None else metrics, kept)
    table.show()
    for row in damaged:
        print(f"DAMAGED  step {row['step']}: {printable(str(row['damaged']))}")
    total = format_bytes(sum(row["bytes"] or 0 for row in rows))
    rules = "unknown (written by an older jaxstow)" if policy is None else str(policy)
    count = f"{len(rows)} step{'s' if len(rows) != 1 else ''}" + (f" ({len(damaged)} damaged)" if damaged else "")
    print(f"{count}, {total}; keep rules: {printable(rules)}")
    return 1 if damaged else 0


def _row(step: Step | DamagedStep, kept_by: list[str] | None) -> dict[str, Any] | None:
    """A step's line: its time, size, metrics and items, or ``damaged``, why it cannot be read (a record that does
    not check, an item file missing); ``None`` for a step deleted since it was listed."""
    row: dict[str, Any] = {"step": step.step, "time": None, "bytes": None, "metrics": {}, "items": None}
    if isinstance(step, DamagedStep):
        return {**row, "kept_by": kept_by, "damaged": str(step.problem)}
    row |= {"time": step.record.time, "metrics": step.record.metrics or {}}
    row["items"] = None if step.record.single else sorted(step.record.files)
    try:
        row["bytes"] = step.size()
    except JaxstowError as error:
        if not is_damage(error):  # an item file missing, or no file in its place
            raise
        if step.deleted():  # by the keep policy of a run saving there: no damage
            return None
        return {**row, "kept_by": kept_by, "damaged": str(error)}
    return {**row, "kept_by": kept_by, "damaged": None}


def _when(time: float) -> str:
    return datetime.datetime.fromtimestamp(time).isoformat(sep=" ", timespec="seconds")


def _hf_folder(args: argparse.Namespace) -> int:
    """What a Hugging Face folder holds: its shards, the tensors and bytes of each, from their headers."""
    with open_hf_folder(args.folder) as folder:
        counts = [0] * len(folder.containers)
        for leaf in folder.layout.values():
            counts[leaf.shards[0].source] += 1
        sizes = file_sizes(folder)
        names = [os.path.basename(container.file) for container in folder.containers]
        index = folder.index
    if args.json:
        shards = [
            {"file": name, "tensors": count, "bytes": size}
            for name, count, size in zip(names, counts, sizes, strict=True)
        ]
        print_json({"folder": args.folder, "format": HF_FOLDER, "index": index, "shards": shards})
        return 0
    table = Table(["shard", "tensors", "size"], right=["tensors", "size"])
    for name, count, size in zip(names, counts, sizes, strict=True):
        table.add(name, count, format_bytes(size))
    table.show()
    tensors = sum(counts)
    described = f"{len(names)} shard{'s' if len(names) != 1 else ''}, {tensors} tensor{'s' if tensors != 1 else ''}"
    where = f"index {printable(index)}" if index else "no index"
    print(f"{printable(args.folder)}: a {HF_FOLDER} of {described}, {format_bytes(sum(sizes))}; {where}")
    return 0


def keep_policy(step: Step) -> KeepPolicy | None:
    """The keep rules recorded with a step, or ``None`` if it has none (or they make no sense)."""
    recorded = step.record.keep_policy
    if recorded is None:
        return None
    try:
        return KeepPolicy(**recorded)
    except (TypeError, ValueError):
        return None
