"""``checkpoint.json``: what a committed step holds, written last into the step's folder.

The record carries the checksum of its own text (``record_xxh3``, computed with that value zeroed) and the header
checksum of each item file, so a changed byte in the record, a missing item file or an item file replaced by
another is an error naming the step and the file, never a restore of something else.

>>> from jaxstow._steps.record import StepRecord
>>> record = StepRecord(step=3, files={"params": "params.safetensors"}, single=False, metrics={"loss": 0.25})
>>> StepRecord.from_json(record.to_json(), where="3/checkpoint.json").metrics
{'loss': 0.25}
>>> StepRecord.from_json(record.to_json().replace(b"0.25", b"0.35"), where="3/checkpoint.json")
Traceback (most recent call last):
...
jaxstow.errors.CorruptFileError: 3/checkpoint.json: the record's checksum does not match: the record is corrupt
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from jaxstow._format.checksum import ZERO_CHECKSUM, checksum_bytes
from jaxstow._format.header_checksum import header_checksum
from jaxstow._format.json_codec import limits_problem, parse_json
from jaxstow._format.json_values import json_problem
from jaxstow._format.native_or_npz import FORMAT_VERSION
from jaxstow._format.source import ReadSource
from jaxstow._steps.keep import KeepPolicy
from jaxstow._storage.marker_limit import MAX_MARKER_BYTES
from jaxstow._storage.member_names import is_member_name
from jaxstow._version import __version__
from jaxstow.errors import (
    ArgumentError,
    CheckpointError,
    CorruptFileError,
    MetadataError,
    NewerFormatError,
    excerpt,
)

__all__ = ["RECORD_NAME", "StepRecord", "check_item_header", "check_metadata", "check_metrics", "missing_item_file"]

#: The name of the record in a step's folder.
RECORD_NAME = "checkpoint.json"
_RECORD_VERSION = 2  # 2: the record's own checksum and each item's header checksum
_CHECKSUM_KEY = "record_xxh3"
#: A quarter of what a reader reads of a record: the rest is ample for its files, headers, parts and metrics.
_MAX_METADATA_BYTES = MAX_MARKER_BYTES // 4
_CHECKSUM = re.compile(r"[0-9a-f]{16}")
#: The first second of the year 9999: no step is saved later, and ``datetime`` shows every time before it in any zone.
_LAST_TIME = 253370764800

Metrics = dict[str, float | None]


def check_metrics(metrics: Mapping[str, Any] | None, *, step: int) -> Metrics | None:
    """Metrics as stored: a dict of names to floats; NaN and infinities become ``None`` (strict JSON has none)."""
    if metrics is None:
        return None
    if not isinstance(metrics, Mapping):
        raise ArgumentError(f"metrics of step {step} must be a dict of names to numbers, not {type(metrics).__name__}")
    out: Metrics = {}
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise ArgumentError(f"metric names of step {step} must be strings, not {name!r}")
        try:
            number = None if _not_a_number(value) else float(value)
        except (TypeError, ValueError):
            number = None
        except OverflowError:  # an int beyond a float's range
            raise ArgumentError(
                f"metric {name!r} of step {step} must be a number a float holds, not {excerpt(value)}"
            ) from None
        if number is None:
            raise ArgumentError(f"metric {name!r} of step {step} must be a number, not {value!r}")
        out[name] = None if math.isnan(number) else number
    return out


def _not_a_number(value: Any) -> bool:
    """A truth value, text or a complex number, which ``float`` would take (numpy's with only a warning)."""
    return isinstance(value, bool | str | bytes) or getattr(getattr(value, "dtype", None), "kind", "") in ("b", "c")


def check_metadata(metadata: Any, *, step: int) -> dict[str, Any] | None:
    """A copy of ``metadata`` if it is a JSON-able dict (or ``None``); a clear error otherwise.

    A copy, so that what a step records is the dict as it was at the save, whatever the caller changes after.
    """
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise MetadataError(f"metadata of step {step} must be a JSON-able dict: a dict, not {type(metadata).__name__}")
    limits = limits_problem(metadata)  # first: a value nested too deep, or holding itself, is walked level by level
    problem = json_problem(metadata) if limits is None else f"it {limits}"
    if problem is not None:
        raise MetadataError(f"metadata of step {step} must be a JSON-able dict: {problem}")
    written = len(json.dumps(metadata, indent=1))  # as the record holds it, which a reader reads up to a limit
    if written > _MAX_METADATA_BYTES:
        raise MetadataError(
            f"metadata of step {step} takes {written} bytes in the step's record, more than the {_MAX_METADATA_BYTES} "
            "(16 MiB) a step's metadata may take: save large data as an item of the step"
        )
    return cast(dict[str, Any], copy.deepcopy(metadata))


@dataclass(frozen=True)
class StepRecord:
    """A committed step: its item files, whether it is one tree or named items, its metrics and metadata.

    A step saved by several processes has, for each item, process 0's file in ``files`` and the other processes'
    files (their shards) in ``parts``. ``headers`` maps each file of the step (``files`` and ``parts`` alike) to the
    checksum of its header (``None`` in records of jaxstow before version 2).
    """

    step: int
    files: dict[str, str]
    single: bool
    metrics: Metrics | None = None
    metadata: dict[str, Any] | None = None
    time: float = field(default_factory=time.time)
    keep_policy: dict[str, Any] | None = None  # the writer's keep rules, for `jaxstow ls`
    parts: dict[str, list[str]] = field(default_factory=dict)
    headers: dict[str, str] | None = None

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
            "headers": self.headers,
            "single": self.single,
            "metrics": None if self.metrics is None else {k: _finite_or_none(v) for k, v in self.metrics.items()},
            **({"infinite_metrics": infinite} if (infinite := _infinite(self.metrics)) else {}),
            "metadata": self.metadata,
            "keep_policy": self.keep_policy,
            **({"parts": self.parts} if self.parts else {}),
            "library": f"jaxstow {__version__}",
            "record_version": _RECORD_VERSION,
            "format_version": FORMAT_VERSION,
            _CHECKSUM_KEY: ZERO_CHECKSUM,
        }
        text = json.dumps(record, indent=1, allow_nan=False).encode()
        return text.replace(_checksum_field(ZERO_CHECKSUM), _checksum_field(checksum_bytes(text)))

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> StepRecord:
        """Parse and check a record; ``where`` names it in errors.

        Any change to a record is a :class:`CorruptFileError`; a record of a newer jaxstow a :class:`NewerFormatError`
        naming that version.
        """
        record = parse_json(data, what="the step record", file=where, error=CorruptFileError)
        version = record.get("record_version") if isinstance(record, dict) else None
        if type(version) is not int or version < 1:
            raise CorruptFileError(
                f"record version {excerpt(version)} is malformed (expected a positive integer)", file=where
            )
        if version > _RECORD_VERSION:
            raise NewerFormatError(
                f"the record was written by {excerpt(record.get('library', 'a newer jaxstow'), limit=40)} (record "
                f"version {version}); this jaxstow {__version__} reads versions up to {_RECORD_VERSION}: upgrade jaxstow",
                file=where,
            )
        # A record of version 1 holds neither field: one that does was written at version 2 (a version changed to 1
        # would leave its metrics unchecked).
        if version >= 2 or _CHECKSUM_KEY in record or "headers" in record:
            _check_record_checksum(data, record.get(_CHECKSUM_KEY), where=where)
        step, files, single = record.get("step"), record.get("files"), record.get("single")
        metrics, metadata, keep_policy = record.get("metrics"), record.get("metadata"), record.get("keep_policy")
        parts, headers, infinite = record.get("parts", {}), record.get("headers"), record.get("infinite_metrics", {})
        fields: list[tuple[str, Callable[[], bool], str]] = [  # checked in order: a later check takes earlier ones
            ("step", lambda: type(step) is int, "an integer"),
            (
                "files",
                lambda: (
                    isinstance(files, dict) and all(isinstance(k, str) and is_member_name(v) for k, v in files.items())
                ),
                "a dict of item names to names of files in the step's folder",
            ),
            (
                "single",
                lambda: isinstance(single, bool) and (not single or len(files) == 1),
                "a boolean, true only where 'files' names one item",
            ),
            ("metrics", lambda: metrics is None or _is_metrics(metrics), "null or names to finite numbers or null"),
            ("metadata", lambda: metadata is None or isinstance(metadata, dict), "null or a JSON object"),
            ("keep_policy", lambda: keep_policy is None or _is_keep_policy(keep_policy), "null or KeepPolicy's rules"),
            ("time", lambda: _is_time(record.get("time")), "seconds since 1970, before the year 9999"),
            (
                "parts",
                lambda: (
                    isinstance(parts, dict)
                    and all(
                        item in files and isinstance(names, list) and all(map(is_member_name, names))
                        for item, names in parts.items()
                    )
                ),
                "a dict of the step's items to lists of names of files in the step's folder",
            ),
            (
                "headers",
                lambda: headers is None or _is_headers(headers, files, parts),
                "null or a dict of each of the step's files to 16 hex digits",
            ),
            ("infinite_metrics", lambda: _is_infinite_metrics(infinite, metrics), '"inf" or "-inf" by null metrics'),
        ]
        wrong = next(((name, expected) for name, valid, expected in fields if not valid()), None)
        if wrong is not None:
            raise CorruptFileError(
                f"the step record lacks a field or has one of the wrong type or out of range: {wrong[0]!r} is "
                f"{excerpt(record.get(wrong[0]))}, expected {wrong[1]}",
                file=where,
            )
        if infinite:
            metrics = {**metrics, **{name: float(sign) for name, sign in infinite.items()}}
        return cls(step, files, single, metrics, metadata, float(record["time"]), keep_policy, parts, headers)


def _checksum_field(value: str) -> bytes:
    return f'"{_CHECKSUM_KEY}": "{value}"'.encode()


def _check_record_checksum(data: bytes, recorded: Any, *, where: str) -> None:
    intact = (
        isinstance(recorded, str)
        and _CHECKSUM.fullmatch(recorded) is not None
        and data.count(_checksum_field(recorded)) == 1
        and checksum_bytes(data.replace(_checksum_field(recorded), _checksum_field(ZERO_CHECKSUM))) == recorded
    )
    if not intact:
        raise CorruptFileError("the record's checksum does not match: the record is corrupt", file=where)


def _is_headers(headers: Any, files: dict[str, Any], parts: Any) -> bool:
    """Whether ``headers`` names the header checksum of each file of the step, and of no other."""
    names = {*files.values(), *(name for names in parts.values() for name in names)}
    return (
        isinstance(headers, dict)
        and headers.keys() == names
        and all(isinstance(value, str) and _CHECKSUM.fullmatch(value) for value in headers.values())
    )


def _is_metrics(metrics: Any) -> bool:
    """Whether ``metrics`` is what :func:`check_metrics` stores: names to finite numbers or ``None``."""
    return isinstance(metrics, dict) and all(value is None or _finite(value) is not None for value in metrics.values())


def _finite_or_none(value: float | None) -> float | None:
    return None if isinstance(value, float) and math.isinf(value) else value


def _infinite(metrics: Metrics | None) -> dict[str, str]:
    """The infinite metrics, which JSON has no number for: stored as ``"inf"`` or ``"-inf"`` beside ``None`` in
    ``metrics`` (which a reader that knows nothing of them takes for no value)."""
    return {k: str(v) for k, v in (metrics or {}).items() if isinstance(v, float) and math.isinf(v)}


def _is_infinite_metrics(infinite: Any, metrics: Any) -> bool:
    return isinstance(infinite, dict) and all(
        sign in ("inf", "-inf") and isinstance(metrics, dict) and name in metrics and metrics[name] is None
        for name, sign in infinite.items()
    )


def _is_time(time: Any) -> bool:
    """Whether ``time`` is a time a step was saved at: seconds since 1970, before the year 9999."""
    seconds = _finite(time)
    return seconds is not None and 0 <= seconds < _LAST_TIME


def _is_keep_policy(policy: Any) -> bool:
    """Whether ``policy`` holds keep rules that :class:`KeepPolicy` accepts (fields of later versions aside)."""
    if not isinstance(policy, dict):
        return False
    known = {field.name for field in dataclasses.fields(KeepPolicy)}
    try:
        KeepPolicy(**{name: value for name, value in policy.items() if name in known})
    except ArgumentError:
        return False
    return True


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, if it is a JSON number (not a bool) that has one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_item_header(record: StepRecord, item: str, file: str, source: ReadSource, where: str) -> None:
    """Check that an item file of a step has the header its record names.

    Its checksum is compared, and checked against the header's text; the data is checked when it is restored. A damaged
    header or a file that is not the one the record names is a :class:`CorruptFileError` naming ``where``.
    """
    found = header_checksum(source)
    expected = None if record.headers is None else record.headers.get(file)
    if expected is not None and found != expected:
        raise CorruptFileError(
            f"the header of item {item!r} of step {record.step} has checksum {found}, but the step's record "
            f"expects {expected}: the file is not the one that was saved",
            file=where,
        )


def missing_item_file(record: StepRecord, item: str, where: str) -> CheckpointError:
    """The error of an item file that a step's record lists but that is not there."""
    return CheckpointError(f"{where}: step {record.step} lists the item {item!r}, but its file is missing", file=where)
