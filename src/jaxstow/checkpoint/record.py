"""``checkpoint.json``: what a committed step holds, written last into the step's folder.

>>> from jaxstow.checkpoint.record import StepRecord
>>> record = StepRecord(step=3, files={"params": "params.safetensors"}, single=False, metrics={"loss": 0.25})
>>> StepRecord.from_json(record.to_json(), where="3/checkpoint.json").metrics
{'loss': 0.25}
"""

from __future__ import annotations

import json
import math
import numbers
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import jaxstow
from jaxstow.errors import FormatError, MetadataError
from jaxstow.format.container import FORMAT_VERSION
from jaxstow.jsonable import json_problem

__all__ = ["RECORD_NAME", "StepRecord", "check_metadata", "check_metrics"]

#: The name of the record in a step's folder.
RECORD_NAME = "checkpoint.json"
_RECORD_VERSION = 1

Metrics = dict[str, float | None]


def check_metrics(metrics: Mapping[str, Any] | None, *, step: int) -> Metrics | None:
    """Metrics as stored: a dict of names to floats; NaN and infinities become ``None`` (strict JSON has none)."""
    if metrics is None:
        return None
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics of step {step} must be a dict of names to numbers, not {type(metrics).__name__}")
    out: Metrics = {}
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise TypeError(f"metric names of step {step} must be strings, not {name!r}")
        try:
            number = None if isinstance(value, bool | str | bytes) else float(value)
        except (TypeError, ValueError):
            number = None
        if number is None:
            raise TypeError(f"metric {name!r} of step {step} must be a number, not {value!r}")
        out[name] = number if math.isfinite(number) else None
    return out


def check_metadata(metadata: Any, *, step: int) -> dict[str, Any] | None:
    """``metadata`` if it is a JSON-able dict (or ``None``); a clear error otherwise."""
    if metadata is None:
        return None
    problem = json_problem(metadata) if isinstance(metadata, dict) else f"a dict, not {type(metadata).__name__}"
    if problem is not None:
        raise MetadataError(f"metadata of step {step} must be a JSON-able dict: {problem}")
    return cast(dict[str, Any], metadata)


def _is_plain_name(name: object) -> bool:
    """Whether ``name`` is a file name inside the step's folder, never a path out of it."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


@dataclass(frozen=True)
class StepRecord:
    """A committed step: its item files, whether it is one tree or named items, its metrics and metadata.

    A step saved by several processes has, for each item, process 0's file in ``files`` and the other processes'
    files (their shards) in ``parts``.
    """

    step: int
    files: dict[str, str]
    single: bool
    metrics: Metrics | None = None
    metadata: dict[str, Any] | None = None
    time: float = field(default_factory=time.time)
    keep_policy: dict[str, Any] | None = None  # the writer's keep rules, for `jaxstow ls`
    parts: dict[str, list[str]] = field(default_factory=dict)

    def item_files(self, item: str) -> list[str]:
        """Every file of ``item``: process 0's first."""
        return [self.files[item], *self.parts.get(item, [])]

    def metric(self, name: str) -> float | None:
        return None if self.metrics is None else self.metrics.get(name)

    def to_json(self) -> bytes:
        record = {
            "step": self.step,
            "time": round(self.time, 3),
            "files": self.files,
            "single": self.single,
            "metrics": self.metrics,
            "metadata": self.metadata,
            "keep_policy": self.keep_policy,
            **({"parts": self.parts} if self.parts else {}),
            "library": f"jaxstow {jaxstow.__version__}",
            "record_version": _RECORD_VERSION,
            "format_version": FORMAT_VERSION,
        }
        return json.dumps(record, indent=1, allow_nan=False).encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> StepRecord:
        """Parse and check a record; ``where`` names it in errors."""
        try:
            record = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise FormatError(f"the step record is not valid JSON ({error})", file=where) from None
        version = record.get("record_version") if isinstance(record, dict) else None
        if type(version) is not int or version > _RECORD_VERSION:
            raise FormatError(
                f"record version {version!r} is not one this jaxstow reads ({_RECORD_VERSION}); upgrade jaxstow",
                file=where,
            )
        step, files, single = record.get("step"), record.get("files"), record.get("single")
        metrics, metadata, keep_policy = record.get("metrics"), record.get("metadata"), record.get("keep_policy")
        parts = record.get("parts", {})
        valid = (
            type(step) is int
            and isinstance(files, dict)
            and all(isinstance(k, str) and _is_plain_name(v) for k, v in files.items())
            and isinstance(single, bool)
            and (not single or len(files) == 1)
            and (metrics is None or isinstance(metrics, dict))
            and (metadata is None or isinstance(metadata, dict))
            and (keep_policy is None or isinstance(keep_policy, dict))
            and isinstance(record.get("time"), numbers.Real)
            and isinstance(parts, dict)
            and all(
                item in files and isinstance(names, list) and all(map(_is_plain_name, names))
                for item, names in parts.items()
            )
        )
        if not valid:
            raise FormatError("the step record lacks a field or has one of the wrong type", file=where)
        return cls(step, files, single, metrics, metadata, float(record["time"]), keep_policy, parts)
