"""``jaxstow ls FOLDER``: the steps of a checkpoint folder, with their time, size, metrics and keep rules.

The keep rules are those of the manager that wrote the newest step (recorded in its ``checkpoint.json``).

>>> import tempfile, jax.numpy as jnp
>>> from jaxstow import CheckpointManager
>>> from jaxstow.cli import main
>>> folder = tempfile.mkdtemp()
>>> with CheckpointManager(folder, keep_last=1, keep_best=1, metric="loss") as manager:
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
from typing import Any

from jaxstow._steps.keep import KeepPolicy
from jaxstow._util.progress import format_bytes
from jaxstow.cli.files import Step, add_storage_arguments, committed_steps
from jaxstow.cli.output import Table, print_json

__all__ = ["add", "keep_policy", "run"]


def add(commands: Any) -> None:
    parser = commands.add_parser(
        "ls",
        help="the steps of a checkpoint folder: step, time, size, metrics, the keep rule that holds each",
        description="List the committed steps of a folder written by jaxstow.CheckpointManager: step, time, size, "
        "metrics, and which keep rule of the manager holds each step.",
    )
    parser.add_argument("folder", help="a checkpoint folder (a path or an fsspec URL)")
    parser.add_argument("--json", action="store_true", help="print the steps as JSON, for scripts")
    add_storage_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    steps = committed_steps(args.folder)
    policy = keep_policy(steps[-1])
    metric = None if policy is None else policy.metric
    reasons = (
        {}
        if policy is None
        else policy.reasons(
            [step.record.step for step in steps],
            {step.record.step: step.record.metric(metric) for step in steps} if metric else {},
            {step.record.step: step.record.time for step in steps},
        )
    )
    rows: list[dict[str, Any]] = [
        {
            "step": step.record.step,
            "time": step.record.time,
            "bytes": step.size(),
            "metrics": step.record.metrics or {},
            "items": None if step.record.single else sorted(step.record.files),
            "kept_by": reasons.get(step.record.step),
        }
        for step in steps
    ]
    if args.json:
        print_json({"folder": args.folder, "keep_policy": steps[-1].record.keep_policy, "steps": rows})
        return 0
    table = Table(["step", "time", "size", "metrics", "kept by"], right=["step", "size"])
    for row in rows:
        when = datetime.datetime.fromtimestamp(row["time"]).isoformat(sep=" ", timespec="seconds")
        metrics = " ".join(
            f"{name}={value:.6g}" if value is not None else f"{name}=nan" for name, value in row["metrics"].items()
        )
        kept = ", ".join(row["kept_by"]) if row["kept_by"] is not None else "-"
        table.add(row["step"], when, format_bytes(row["bytes"]), metrics, kept)
    table.show()
    total = format_bytes(sum(row["bytes"] for row in rows))
    rules = "unknown (written by an older jaxstow)" if policy is None else _describe(policy)
    print(f"{len(rows)} step{'s' if len(rows) != 1 else ''}, {total}; keep rules: {rules}")
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


def _describe(policy: KeepPolicy) -> str:
    rules = [f"keep_last={policy.keep_last}"] if policy.keep_last else []
    rules += [f"keep_every={policy.keep_every}"] if policy.keep_every else []
    rules += [f"keep_every_seconds={policy.interval:g}"] if policy.interval else []
    rules += [f"keep_best={policy.keep_best} by {policy.metric} ({policy.mode})"] if policy.keep_best else []
    return ", ".join(rules) or "none (every step is kept)"
