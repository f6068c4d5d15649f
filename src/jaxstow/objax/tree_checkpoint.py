"""``TreeCheckpoint``: Objax's checkpointing API for JAX trees, on the manager's step naming, keep policy and lock."""

from __future__ import annotations

import fnmatch
import functools
import logging
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from jaxstow._save_load import load, save
from jaxstow._steps.keep import KeepPolicy
from jaxstow._steps.names import StepNames, check_step
from jaxstow._storage.lock import lock_store
from jaxstow._storage.opening import local_path
from jaxstow._storage.settings import storage_settings
from jaxstow._storage.store import Store, open_store
from jaxstow.errors import ArgumentError, CheckpointError, PathNotFoundError
from jaxstow.objax.variables import load_var_collection, save_var_collection

__all__ = ["TreeCheckpoint"]

_TAKE_OPTIONS = (load, save, load_var_collection, save_var_collection)

logger = logging.getLogger(__name__)


class TreeCheckpoint:
    """Keeps the ``keep_ckpts`` latest checkpoints of a run in ``logdir/DIR_NAME``, one file per index.

    ``logdir/ckpt/0000000042.npz`` is the checkpoint of index 42; stray files are ignored. Unlike Objax's,
    :meth:`restore` returns the restored tree (JAX trees are values, not variables). Each save holds the folder's
    lock while it writes: a save of another process meanwhile is refused, and any other checkpoint object of the folder
    may save after it. Subclasses may override ``DIR_NAME``, ``FILE_MATCH`` (a glob), ``FILE_FORMAT``,
    ``SAVE_FN(path, tree)`` and ``LOAD_FN(path, like)`` (in ``staticmethod``).

    >>> import tempfile, jax.numpy as jnp
    >>> from jaxstow.objax import TreeCheckpoint
    >>> ckpt = TreeCheckpoint(logdir=tempfile.mkdtemp(), keep_ckpts=2)
    >>> for idx in (1, 5, 3, 10, 7):
    ...     ckpt.save({"b": jnp.full(1, idx, jnp.int32)}, idx=idx)
    >>> tree, idx, path = ckpt.restore()
    >>> idx, path.rsplit("/", 2)[1:], tree["b"]
    (10, ['ckpt', '0000000010.npz'], Array([10], dtype=int32))
    """

    DIR_NAME: ClassVar[str] = "ckpt"
    FILE_MATCH: ClassVar[str] = "*.npz"
    FILE_FORMAT: ClassVar[str] = "%010d.npz"
    LOAD_FN: ClassVar[Callable[[str, Any], Any]] = staticmethod(load)
    SAVE_FN: ClassVar[Callable[[str, Any], None]] = staticmethod(save)

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        keep_ckpts: int | None,
        makedir: bool = True,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Open the checkpoints' folder, ``logdir/DIR_NAME``.

        Args:
            logdir: A path or an fsspec URL (``s3://bucket/run``); each file is saved all or nothing.
            keep_ckpts: How many of the highest indices to keep (``None``: every one).
            makedir: Create the folder now.
            storage_options: Passed to fsspec for a URL ``logdir`` (by jaxstow's own save and load functions;
                others reach the store themselves, e.g. through fsspec's environment variables).
        """
        local = local_path(logdir)
        # A local folder is made absolute once: a later change of the working directory leads nowhere else.
        self.logdir = os.fspath(logdir) if local is None else os.path.abspath(local)
        self.keep_ckpts = keep_ckpts
        self.storage_options = storage_options
        valid = keep_ckpts is None or (isinstance(keep_ckpts, numbers.Integral) and not isinstance(keep_ckpts, bool))
        if not valid or (keep_ckpts is not None and keep_ckpts < 1):
            raise ArgumentError(f"keep_ckpts must be how many checkpoints to keep, at least 1, not {keep_ckpts!r}")
        self._policy = KeepPolicy(keep_last=None if keep_ckpts is None else int(keep_ckpts))
        self._names = StepNames(self.FILE_FORMAT)
        self._store: Store = open_store(
            self.directory, marker="", settings=storage_settings(storage_options, None, None)
        )
        if makedir:
            self._store.ensure()

    @property
    def directory(self) -> str:
        """The folder of the checkpoint files, ``logdir/DIR_NAME``."""
        if local_path(self.logdir) is None:
            return f"{self.logdir.rstrip('/')}/{self.DIR_NAME}"
        return os.path.join(self.logdir, self.DIR_NAME)

    def path(self, idx: int) -> str:
        """The file of index ``idx``, a non-negative integer (Python or numpy; anything else is an
        :class:`~jaxstow.errors.ArgumentError`)."""
        return self._store.url(self._names.name(check_step(idx, what="idx")))

    def indices(self) -> list[int]:
        """The indices of the checkpoints in the folder, in increasing order."""
        # A subclass that set FILE_FORMAT alone ("step-%06d.jxs") keeps Objax's FILE_MATCH ("*.npz"), which matches
        # none of its files: its files are then those FILE_FORMAT names, as they are in any case.
        match = self.FILE_MATCH if fnmatch.fnmatch(self._names.name(0), self.FILE_MATCH) else "*"
        return self._names.steps(fnmatch.filter(self._store.files(), match))

    @classmethod
    def checkpoint_idx(cls, filename: str) -> int:
        """The index of the checkpoint file ``filename`` (a path or a name)."""
        idx = StepNames(cls.FILE_FORMAT).step(os.path.basename(filename))
        if idx is None:
            raise ArgumentError(f"{filename} is not a checkpoint file name (made by {cls.FILE_FORMAT!r})")
        return idx

    def find(self, idx: int | None = None) -> tuple[int, str]:
        """The index and path of checkpoint ``idx`` (the latest by default), or ``(0, "")`` if there is none.

        A missing ``idx`` raises :class:`~jaxstow.errors.PathNotFoundError` (a ``FileNotFoundError``), one that is no
        non-negative integer an :class:`~jaxstow.errors.ArgumentError`.
        """
        if idx is not None:
            idx = check_step(idx, what="idx")
        else:
            indices = self.indices()
            if not indices:
                return 0, ""
            idx = indices[-1]
        path = self.path(idx)
        if self._names.name(idx) not in self._store.files():
            raise PathNotFoundError(f"no checkpoint {idx} here (its indices: {self.indices()})", file=path)
        return idx, path

    def restore(self, like: Any = None, idx: int | None = None) -> tuple[Any, int, str]:
        """Restore checkpoint ``idx`` (the latest by default).

        Args:
            like: A target tree for ``LOAD_FN`` (``None`` rebuilds the tree from its file).
            idx: The index to restore.

        Returns:
            ``(tree, idx, path)``; ``(like, 0, "")`` when the folder holds no checkpoint.

        Raises:
            FileNotFoundError: There is no checkpoint ``idx``.
            ArgumentError: ``idx`` is no non-negative integer.
        """
        idx, path = self.find(idx)
        if not path:
            return like, 0, ""
        logger.info("restoring %s", path)
        return self._function(type(self).LOAD_FN)(path, like), idx, path

    def save(self, tree: Any, idx: int) -> None:
        """Save ``tree`` as checkpoint ``idx`` (atomically), then delete all but the ``keep_ckpts`` latest.

        ``idx`` is a non-negative integer (Python or numpy): a float, a bool or a negative number is an
        :class:`~jaxstow.errors.ArgumentError`, and nothing is written. So is an ``idx`` that ``keep_ckpts`` higher
        indices in the folder (another run's) would have deleted at once: a :class:`~jaxstow.errors.CheckpointError`.
        """
        idx = check_step(idx, what="idx")
        lock = lock_store(self._store)  # for this save alone: another Checkpoint of the folder may save next
        try:
            self._store.cleanup(lambda name: False)  # what a save killed midway left
            self._refuse_deleted_at_once(idx)
            self._function(type(self).SAVE_FN)(self.path(idx), tree)
            for old in self._policy.to_delete(self.indices(), {}):
                self._store.remove(self._names.name(old))
        finally:
            lock.release()

    def _refuse_deleted_at_once(self, idx: int) -> None:
        """Refuse to save ``idx`` where the keep rule would delete it as soon as it is written, and restore a higher
        index in its place: the folder holds ``keep_ckpts`` higher ones."""
        indices = self.indices()
        if idx not in self._policy.to_delete(sorted({*indices, idx}), {}):
            return
        higher = [index for index in indices if index > idx]
        shown = ", ".join(map(str, higher[:5])) + (", ..." if len(higher) > 5 else "")
        raise CheckpointError(
            f"{self.path(idx)}: checkpoint {idx} would be deleted as soon as it is saved, and restore() would take "
            f"checkpoint {higher[-1]} instead: keep_ckpts={self.keep_ckpts} keeps the highest indices, and "
            f"{self.directory} holds the higher indices {shown}, another run's or this run's before it went back. "
            f"Give this run a logdir of its own, delete the higher checkpoints, or save under an index above "
            f"{higher[-1]}",
            file=self.path(idx),
        )

    def _function(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function``, given the storage options if it is one of jaxstow's (which take them)."""
        if self.storage_options and function in _TAKE_OPTIONS:
            return functools.partial(function, storage_options=self.storage_options)
        return function
