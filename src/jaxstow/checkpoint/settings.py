"""The grouped settings of a :class:`~jaxstow.CheckpointManager`: the keep rules in a
:class:`~jaxstow.KeepPolicy`, the local tier in a :class:`LocalTier`; and the keywords that set them one by one
before, which still work as deprecated shortcuts.

>>> import warnings
>>> from jaxstow.checkpoint.settings import LocalTier, grouped_settings
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     keep, local, asynchronous = grouped_settings(None, None, {"keep_last": 3}, directory="run")
>>> keep, local, asynchronous
(KeepPolicy(keep_last=3, keep_every=None, keep_best=None, metric=None, mode='min', keep_every_seconds=None), None, True)
>>> print(caught[0].message)
CheckpointManager(keep_last=3) is deprecated: pass keep=KeepPolicy(keep_last=3) (from jaxstow import KeepPolicy)
>>> LocalTier("/mnt/ssd/run", keep_last=3)
LocalTier(directory='/mnt/ssd/run', save_every=1, keep_last=3, replicas=None)
"""

from __future__ import annotations

import difflib
import inspect
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxstow._steps.keep import KeepPolicy
from jaxstow._storage.opening import local_path
from jaxstow._util.counts import count
from jaxstow.errors import ArgumentError

__all__ = [
    "SETTINGS",
    "LocalTier",
    "check_flags",
    "check_ranked",
    "checked_broadcast",
    "grouped_settings",
    "without_shortcuts",
]

#: The keyword settings of ``CheckpointManager`` itself (a shortcut's name is refused if misspelled, with these).
SETTINGS = (
    "save_every",
    "keep",
    "local",
    "progress",
    "storage_options",
    "transfer",
    "cache_dir",
    "host_memory_limit",
    "process_timeout",
    "broadcast_restore",
    "preemption_signals",
)
_KEEP = ("keep_last", "keep_every", "keep_best", "metric", "mode", "keep_every_seconds")
_LOCAL = {"local_directory": "directory", "local_save_every": "save_every", "local_keep_last": "keep_last"}
_LOCAL |= {"local_replicas": "replicas"}
#: orbax's names of settings (``ocp.CheckpointManagerOptions``), and how a jaxstow manager is given them.
_ORBAX = {
    "max_to_keep": "keep=KeepPolicy(keep_last=...)",
    "keep_period": "keep=KeepPolicy(keep_every=...)",
    "keep_time_interval": "keep=KeepPolicy(keep_every_seconds=...)",
    "best_fn": "keep=KeepPolicy(keep_best=..., metric=NAME), the metrics given to save(..., metrics=)",
    "best_mode": "keep=KeepPolicy(keep_best=..., metric=NAME, mode=...)",
    "save_interval_steps": "save_every=...",
    "enable_async_checkpointing": "saves run in the background; manager.wait() after a save waits for it",
    "create": "nothing: the first save makes the folder",
}


@dataclass(frozen=True)
class LocalTier:
    """Each process's fast storage (a local SSD, say) as a checkpoint's first tier (see docs/scaling.md, "Two tiers
    and peers"). Every step saved goes there first; the persistent ``directory`` gets the steps due there, copied
    from it in the background.

    Args:
        directory: A local path; it may differ per process. Under ``jax.distributed`` each process keeps its steps
            in ``process-{index}`` in it, so that the processes of one host may share it.
        save_every: :meth:`~jaxstow.CheckpointManager.should_save` also picks every ``save_every``-th step for it.
        keep_last: It keeps its newest ``keep_last`` steps.
        replicas: How many other processes keep a copy of each process's files (1 under ``jax.distributed``).

    Raises:
        ArgumentError: A directory that is not a local path, or a number out of range.
    """

    directory: str | os.PathLike[str]
    save_every: int = 1
    keep_last: int = 2
    replicas: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.directory, str | os.PathLike) or not os.fspath(self.directory):
            raise ArgumentError(
                f"LocalTier's directory must be a local path, such as '/mnt/ssd/run', not {self.directory!r}"
            )
        if local_path(self.directory) is None:
            raise ArgumentError(
                f"LocalTier's directory must be a local path (each process's own fast storage), not {self.directory!r}"
            )
        for name in ("save_every", "keep_last"):
            object.__setattr__(self, name, count(getattr(self, name), f"LocalTier's {name}"))
        if self.replicas is not None:
            object.__setattr__(self, "replicas", count(self.replicas, "LocalTier's replicas", least=0, or_none=True))

    @property
    def root(self) -> str:
        """The directory as an absolute local path."""
        return os.path.abspath(local_path(self.directory) or "")


def grouped_settings(
    keep: KeepPolicy | None, local: LocalTier | None, shortcuts: dict[str, Any], *, directory: str
) -> tuple[KeepPolicy, LocalTier | None, bool]:
    """The keep policy, the local tier and whether saves run in the background, from the grouped settings and the
    deprecated ``shortcuts`` (each warned of with the form that replaces it). A keyword that is neither, or a
    shortcut that sets what a grouped setting sets too, is an :class:`~jaxstow.errors.ArgumentError`."""
    unknown = [name for name in shortcuts if name not in (*_KEEP, *_LOCAL, "async_save")]
    if unknown:
        near = difflib.get_close_matches(unknown[0], [*SETTINGS, *_KEEP, *_LOCAL], n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        if unknown[0] in _ORBAX:
            hint = f" (orbax's CheckpointManagerOptions' {unknown[0]}: here, {_ORBAX[unknown[0]]})"
        raise ArgumentError(f"CheckpointManager() got an unexpected keyword argument {unknown[0]!r}{hint}")
    if keep is not None and not isinstance(keep, KeepPolicy):
        raise ArgumentError(f"keep must be a jaxstow.KeepPolicy, such as KeepPolicy(keep_last=3), not {keep!r}")
    if local is not None and not isinstance(local, LocalTier):
        raise ArgumentError(f"local must be a jaxstow.LocalTier, such as LocalTier('/mnt/ssd/run'), not {local!r}")
    rules = {name: shortcuts[name] for name in _KEEP if name in shortcuts}
    if rules:
        given = _call(rules)
        if keep is not None:
            raise ArgumentError(f"keep={keep!r} and {given} both set the keep rules: put {given} into the KeepPolicy")
        keep = KeepPolicy(**rules)
        _deprecated(given, f"pass keep={_call(rules, 'KeepPolicy')} (from jaxstow import KeepPolicy)")
    named = [
        name for name in _LOCAL if name in shortcuts and not (name == "local_directory" and shortcuts[name] is None)
    ]
    tier = {_LOCAL[name]: shortcuts[name] for name in named}
    if tier:
        given = _call({name: shortcuts[name] for name in named})
        if local is not None:
            raise ArgumentError(f"local={local!r} and {given} both set the local tier: put them into the LocalTier")
        if "directory" not in tier:
            fields = _call(tier)
            raise ArgumentError(
                f"{given} {'set' if ',' in given else 'sets'} the local tier, but the manager of {directory} has no "
                f"local directory: pass local=LocalTier(directory, {fields}) (each process's fast storage, such as a "
                f"local SSD) to save there too, or leave {given} out (save_every is the schedule of {directory} itself)"
            )
        local = LocalTier(tier.pop("directory"), **tier)
        shown = _call({"directory": local.directory, **tier}, "LocalTier").replace("directory=", "", 1)
        _deprecated(given, f"pass local={shown} (from jaxstow import LocalTier)")
    if (
        local is not None
        and (path := local_path(directory)) is not None
        and os.path.realpath(local.root) == os.path.realpath(path)
    ):
        raise ArgumentError(
            f"local=LocalTier({local.directory!r}) is the checkpoint directory itself: the local tier is a folder of "
            "each process's fast storage, apart from the directory (a folder inside it works too)"
        )
    asynchronous = shortcuts.get("async_save", True)
    if "async_save" in shortcuts:
        if not isinstance(asynchronous, bool):
            raise ArgumentError(f"async_save must be True or False, not {asynchronous!r}")
        _deprecated(
            _call({"async_save": asynchronous}),
            "saves run in the background: leave async_save out, and call manager.wait() after a save to wait for it",
        )
    return keep or KeepPolicy(), local, asynchronous


def checked_broadcast(value: Any) -> bool | None:
    """``broadcast_restore`` as given, once it is ``True``, ``False`` or ``None`` (jaxstow decides)."""
    if value is not None and not isinstance(value, bool | np.bool_):
        raise ArgumentError(f"broadcast_restore takes True, False or None (jaxstow decides), not {value!r}")
    return None if value is None else bool(value)


def check_flags(**flags: Any) -> None:
    """Refuse a flag (``force=``, ``copy=``, ``fallback=``) that is not ``True`` or ``False``: a string from a config
    file, such as ``"false"``, would count as true, and ``force`` would replace a saved step."""
    for name, value in flags.items():
        if not isinstance(value, bool | np.bool_):
            raise ArgumentError(f"{name} must be True or False, not {value!r} (a string such as 'false' is true)")


def check_ranked(policy: KeepPolicy, metrics: dict[str, Any] | None, *, step: int) -> None:
    """Refuse a save of ``step`` without the metric that ``policy`` ranks steps by (its ``keep_best``)."""
    if policy.ranks and policy.metric not in (metrics or {}):
        raise ArgumentError(
            f"keep_best ranks steps by the metric {policy.metric!r}, so save(step={step}) needs "
            f"metrics={{{policy.metric!r}: ...}}"
        )


def without_shortcuts(init: Callable[..., None]) -> inspect.Signature:
    """The signature of a class made by ``init``, as its users see it: the deprecated shortcuts, which ``init`` takes
    as ``**shortcuts``, left out (``inspect.signature``, ``help``)."""
    signature = inspect.signature(init)
    kept = [p for p in list(signature.parameters.values())[1:] if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return signature.replace(parameters=kept)


def _call(values: dict[str, Any], name: str = "") -> str:
    arguments = ", ".join(f"{key}={value!r}" for key, value in values.items())
    return f"{name}({arguments})" if name else arguments


def _deprecated(given: str, instead: str) -> None:
    warnings.warn(f"CheckpointManager({given}) is deprecated: {instead}", DeprecationWarning, stacklevel=4)
