"""The checkpointer a :class:`~jaxstow.train.Trainer` uses unless it is given another: one file per kept epoch."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import numbers
import os

import jax
import numpy as np

from jaxstow._names.registry import saveable
from jaxstow._read.narrowing import NARROWED
from jaxstow._read.reader import open as open_reader
from jaxstow._save_load import load, save
from jaxstow._steps.names import check_step
from jaxstow._storage.failures import storage_error, storage_failures
from jaxstow._storage.folders import make_folder
from jaxstow.errors import ArgumentError, FormatError, JaxstowError, PathNotFoundError
from jaxstow.train.checkpointer import AbstractCheckpointer
from jaxstow.train.files import FileNames
from jaxstow.train.state import Checkpoint, as_checkpoint, described_state, is_checkpoint

__all__ = ["DefaultCheckpointer", "DefaultCheckpointerArguments"]

PathLike = str | os.PathLike[str]


def _checkpoints_in_cwd() -> str:
    return os.path.join(os.getcwd(), "checkpoints")


@dataclasses.dataclass
class DefaultCheckpointerArguments:
    """How a :class:`DefaultCheckpointer` behaves.

    Attributes:
        checkpoint: whether to write anything at all; ``False`` turns every save, forced or not, into a no-op.
        delete_existing_checkpoints: delete this checkpointer's own files (its prefix and extension) from
            ``save_dir`` and ``model_state_save_dir`` when it is made; other files are left alone.
        period: keep the checkpoint of every index that is a multiple of ``period`` (a positive integer,
            Python or numpy).
        save_dir: folder of the checkpoints, made when first needed; ``./checkpoints`` of the current folder at the
            time the arguments are made. A relative folder (here and below) is one of the working directory when the
            checkpointer is made, whatever it is later.
        model_state_save_dir: folder of the model files written by ``save_model``; ``None`` or ``""`` writes none.
        load_dir: folder to resume from; ``None`` or ``""`` starts from scratch.
        load_filename: a file in ``load_dir`` to resume from; without it, the checkpoint with the largest index there.
        file_prefix: files are named ``{file_prefix}_{index}.{file_ext}`` and ``{file_prefix}_model_{index}.{file_ext}``.
        file_ext: the extension, without its dot. ``npz`` writes numpy archives, anything else the native format (a
            safetensors file).
        log_level: level of the checkpointer's logger (``"DEBUG"``, ``"INFO"``, ``"WARNING"``, ..., or
            ``logging.INFO``, ...).
        as_numpy: resume every array as a numpy array, as :func:`jaxstow.load` gives it with ``as_numpy=True``
            (torch tensors too), 64-bit ones whole; by default arrays come back as ``jax.Array`` (torch tensors as
            tensors), and a float64 array as float32 where jax's 64-bit mode is off, with a warning naming it.
    """

    checkpoint: bool = True
    delete_existing_checkpoints: bool = False
    period: int = 1
    save_dir: PathLike = dataclasses.field(default_factory=_checkpoints_in_cwd)
    model_state_save_dir: PathLike | None = dataclasses.field(default_factory=_checkpoints_in_cwd)
    load_dir: PathLike | None = None
    load_filename: str | None = None
    file_prefix: str = "checkpoint"
    file_ext: str = "jxs"
    log_level: str | int = "INFO"
    as_numpy: bool = False


saveable(DefaultCheckpointerArguments, name="jaxstow.train.DefaultCheckpointerArguments")  # see TrainerArguments


class DefaultCheckpointer(AbstractCheckpointer):
    """Writes ``{prefix}_{index}.{ext}`` every ``period`` indices and ``{prefix}_model_{index}.{ext}`` on request.

    Files are written through :func:`jaxstow.save`, atomically, so saving an index again replaces its file and a
    crash never leaves a torn one. It resumes from a named file or from the checkpoint with the largest index:
    PyMarlin's ``DefaultCheckpointer``. See docs/trainer-contract.md.

    >>> import os, tempfile
    >>> import jax.numpy as jnp
    >>> from jaxstow.train import Checkpoint, DefaultCheckpointer, DefaultCheckpointerArguments
    >>> folder = tempfile.mkdtemp()
    >>> args = DefaultCheckpointerArguments(save_dir=folder, model_state_save_dir=folder, load_dir=folder, period=2)
    >>> checkpointer = DefaultCheckpointer(args)
    >>> for epoch in range(4):
    ...     state = Checkpoint(module_interface_state={"w": jnp.full(2, epoch)}, trainer_state={"last_epoch": epoch})
    ...     path = checkpointer.save(state, epoch)
    >>> checkpointer.save(state, 3, force=True) == os.path.join(folder, "checkpoint_3.jxs")
    True
    >>> checkpointer.save_model(state.module_interface_state, 3) == os.path.join(folder, "checkpoint_model_3.jxs")
    True
    >>> sorted(os.listdir(folder))
    ['checkpoint_0.jxs', 'checkpoint_2.jxs', 'checkpoint_3.jxs',
     'checkpoint_model_3.jxs']
    >>> checkpointer.load().trainer_state
    {'last_epoch': 3}
    """

    def __init__(self, args: DefaultCheckpointerArguments | None = None) -> None:
        """Check the arguments and delete this checkpointer's old files if they ask it.

        Args:
            args: How it behaves (``DefaultCheckpointerArguments()`` by default).

        Raises:
            ArgumentError: An argument that is not valid.
        """
        self.args = args if args is not None else DefaultCheckpointerArguments()
        #: The working directory when the checkpointer was made, which relative folders are taken from: a later
        #: ``os.chdir`` (a notebook's ``%cd``, a library) leads neither saves nor the resume to another folder.
        self.working_directory = os.getcwd()
        _check(self.args, self.working_directory)
        #: The file the last :meth:`load` resumed from (``None``: none yet, or it started from scratch).
        self.resumed_from: str | None = None
        level = self.args.log_level
        # A logger of its own, at its own level, whose records go to the handlers of the class's logger and above:
        # setting the class's level would set every checkpointer's.
        self.logger = logging.Logger(
            AbstractCheckpointer.logger.name, level if isinstance(level, int) else level.upper()
        )
        self.logger.parent = AbstractCheckpointer.logger
        if self.args.delete_existing_checkpoints:
            doomed = self._own_files()
            resume = self._named_resume_file()
            if resume is not None and os.path.realpath(resume) in {os.path.realpath(path) for path in doomed}:
                raise ArgumentError(
                    f"DefaultCheckpointerArguments: delete_existing_checkpoints would delete {resume}, the "
                    "load_filename to resume from, before it is resumed from; unset one of them"
                )
            for folder in sorted({os.path.dirname(path) for path in doomed}):  # none deleted unless all may be
                _refuse_unchangeable(folder)
            for path in doomed:
                with storage_failures(path, doing="delete it"), contextlib.suppress(FileNotFoundError):
                    os.remove(path)  # a file gone already: deleted by another rank's checkpointer meanwhile
                    self.logger.info("deleted %s", path)

    @property
    def names(self) -> FileNames:
        """How this checkpointer names its files, from the current ``file_prefix`` and ``file_ext``."""
        return FileNames(self.args.file_prefix, self.args.file_ext)

    def save(self, checkpoint_state: Checkpoint, index: int, force: bool = False) -> str | None:
        """Write ``checkpoint_state`` to ``save_dir`` if checkpointing is on and ``index`` is a multiple of the
        period or ``force`` is set; the path written, or ``None``.

        ``index`` is an integer (Python, numpy or a 0-d jax array); a float or a bool, whose file would never be
        resumed from, is an :class:`~jaxstow.errors.ArgumentError`."""
        _check_use(self.args, self.working_directory)
        index = check_step(index, what="the checkpoint's index", negative=True)
        if not isinstance(force, bool | np.bool_):
            raise ArgumentError(f"save's force must be True or False, not {force!r}")
        if not is_checkpoint(checkpoint_state):  # load() would refuse the file, the newest, and resume from none
            raise ArgumentError(
                f"{self._in(self.args.save_dir, self.names.checkpoint(index))}: save() keeps a "
                f"jaxstow.train.Checkpoint (or a dict of its fields), not {described_state(checkpoint_state)}, which "
                "load() could not resume from: save Checkpoint(module_interface_state=...), or a module's state alone "
                "with save_model()"
            )
        if not self.args.checkpoint or (index % self.args.period != 0 and not force):
            return None
        return self._write(self.args.save_dir, self.names.checkpoint(index), checkpoint_state)

    def save_model(self, model_state: object, index: int) -> str | None:
        """Write the module's state to ``model_state_save_dir`` if checkpointing is on and that folder is set; the
        path written, or ``None``. Model files are never taken as checkpoints to resume from."""
        _check_use(self.args, self.working_directory)
        index = check_step(index, what="the model file's index", negative=True)
        if not self.args.checkpoint or not self.args.model_state_save_dir:
            return None
        return self._write(self.args.model_state_save_dir, self.names.model(index), model_state)

    def load(self) -> Checkpoint:
        """The checkpoint at ``load_dir/load_filename``, else the latest in ``load_dir``, else ``Checkpoint()``."""
        _check_use(self.args, self.working_directory)
        path = self.resumed_from = self._resume_path()
        if path is None:
            return Checkpoint()
        try:
            checkpoint = as_checkpoint(load(path, as_numpy=self.args.as_numpy), file=path)
        except JaxstowError as error:
            if isinstance(error, FormatError) and self._named_resume_file() is None:  # damage, not a setting
                error.add_note(
                    f"{path} is the newest checkpoint in load_dir: move it aside to resume from the one before it, "
                    "or name the file to resume from with DefaultCheckpointerArguments(load_filename=...)"
                )
            raise
        if not self.args.as_numpy and (narrowed := _rounded_by_jax(path)):
            self.logger.warning(
                "%s: %s resumed in 32 bits, as jax with its 64-bit mode off holds them: to resume them whole, pass "
                "DefaultCheckpointerArguments(as_numpy=True) or turn x64 on (jax.config.update('jax_enable_x64', "
                "True)) before loading",
                path,
                narrowed,
            )
        self.logger.info("resumed from %s", path)
        return checkpoint

    def _in(self, folder: PathLike, *name: str) -> str:
        """``folder/name``, a relative ``folder`` taken from the working directory when the checkpointer was made."""
        return os.path.join(self.working_directory, folder, *name)

    def _write(self, folder: PathLike, name: str, tree: object) -> str:
        make_folder(self._in(folder))
        path = self._in(folder, name)
        save(path, tree)
        self.logger.info("saved %s", path)
        return path

    def _resume_path(self) -> str | None:
        load_dir = self.args.load_dir
        if not load_dir:
            self.logger.info("no load_dir: starting from scratch")
            return None
        path = self._named_resume_file()
        if path is not None:
            if not os.path.isfile(path):
                raise PathNotFoundError("load_filename names no file in load_dir", file=path)
            return path
        latest = self.get_latest_file(self._in(load_dir), self.args.file_prefix, self.args.file_ext)
        if not latest:
            self.logger.warning(
                "no checkpoint %s in %s: starting from scratch", self.names.checkpoint_pattern, load_dir
            )
            return None
        return latest

    @staticmethod
    def get_latest_file(load_dir: PathLike, file_prefix: str, file_ext: str = "pt") -> str:
        """The path of the checkpoint ``{file_prefix}_{index}.{file_ext}`` with the largest index in ``load_dir``, or
        ``""`` when there is none (model files and other names are never taken).

        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> for name in ["run_2.pt", "run_10.pt", "run_model_11.pt"]:
        ...     open(os.path.join(folder, name), "wb").close()
        >>> DefaultCheckpointer.get_latest_file(folder, "run", "pt") == os.path.join(folder, "run_10.pt")
        True
        """
        found = FileNames(file_prefix, file_ext).find(load_dir)
        return found[max(found)] if found else ""

    def _named_resume_file(self) -> str | None:
        if not (self.args.load_dir and self.args.load_filename):
            return None
        return self._in(self.args.load_dir, self.args.load_filename)

    def _own_files(self) -> list[str]:
        """This checkpointer's files (its prefix and extension) in ``save_dir`` and ``model_state_save_dir``."""
        own = list(self.names.find(self._in(self.args.save_dir)).values())
        if self.args.model_state_save_dir:
            own += self.names.find(self._in(self.args.model_state_save_dir), model=True).values()
        return own


def _refuse_unchangeable(folder: str) -> None:
    """A :class:`~jaxstow.errors.StorageError` where this process may not delete files in ``folder`` (a read-only
    folder or file system, no permission)."""
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        code = errno.EROFS if os.statvfs(folder).f_flag & os.ST_RDONLY else errno.EACCES
        raise storage_error(
            OSError(code, os.strerror(code)), folder, doing="delete this checkpointer's old files in it"
        )


def _rounded_by_jax(path: str) -> list[str]:
    """The float arrays of the file at ``path`` that jax, its 64-bit mode off, rounds to 32 bits (float64 and
    complex128: a 64-bit integer is resumed exactly or refused)."""
    if np.dtype(jax.dtypes.canonicalize_dtype(np.float64)) == np.float64:  # x64 on
        return []
    with open_reader(path) as reader:
        return [
            name
            for name, leaf in reader.stored.items()
            if leaf.kind in ("array", "sharded") and leaf.dtype in NARROWED and leaf.dtype.kind in "fc"
        ]


def _check_path(args: DefaultCheckpointerArguments, field: str, *, optional: bool) -> None:
    value = getattr(args, field)
    if optional and value in (None, ""):
        return
    if not isinstance(value, (str, os.PathLike)) or os.fspath(value) in ("",) or "\x00" in os.fspath(value):
        allowed = "a folder (str or os.PathLike)" + (", or None" if optional else "")
        raise ArgumentError(f"DefaultCheckpointerArguments.{field} must be {allowed}, not {value!r}")


def _check_name_part(args: DefaultCheckpointerArguments, field: str) -> None:
    value = getattr(args, field)
    if not isinstance(value, str) or not value or any(sep and sep in value for sep in (os.sep, os.altsep, "\x00")):
        raise ArgumentError(
            f"DefaultCheckpointerArguments.{field} must be a non-empty name without a folder separator (the files "
            f"go in save_dir and are found there), not {value!r}"
        )


def _check(args: DefaultCheckpointerArguments, working_directory: str) -> None:
    """Refuse arguments that cannot work, before anything is written or deleted."""
    _check_use(args, working_directory)
    if (
        args.delete_existing_checkpoints
        and args.load_dir
        and os.path.realpath(args.load_dir) == os.path.realpath(args.save_dir)
    ):
        raise ArgumentError(
            f"DefaultCheckpointerArguments: delete_existing_checkpoints would delete the checkpoints in {args.load_dir}, "
            "which is also load_dir, before they are resumed from; unset one of them"
        )


def _check_use(args: DefaultCheckpointerArguments, working_directory: str) -> None:
    """Refuse arguments that a save or a load cannot work with: checked again by each, as a trainer may set them on
    ``checkpointer.args`` after the checkpointer is made (``checkpointer.args.checkpoint = True``)."""
    _check_path(args, "save_dir", optional=False)
    _check_path(args, "model_state_save_dir", optional=True)
    _check_path(args, "load_dir", optional=True)
    if args.load_filename is not None and not isinstance(args.load_filename, str):
        raise ArgumentError(
            f"DefaultCheckpointerArguments.load_filename must be a file name in load_dir, not {args.load_filename!r}"
        )
    _check_name_part(args, "file_prefix")
    _check_name_part(args, "file_ext")
    FileNames(args.file_prefix, args.file_ext)  # refuses a prefix whose checkpoints another prefix's model files name
    if args.file_ext.startswith("."):
        raise ArgumentError(
            f"DefaultCheckpointerArguments.file_ext is the extension without its dot ({args.file_ext[1:]!r}), not "
            f"{args.file_ext!r}: the files would be named checkpoint_0.{args.file_ext}"
        )
    for flag in ("checkpoint", "delete_existing_checkpoints"):  # "false" from a config file would mean True
        if not isinstance(getattr(args, flag), bool | np.bool_):
            raise ArgumentError(
                f"DefaultCheckpointerArguments.{flag} must be True or False, not {getattr(args, flag)!r}"
            )
    if args.load_dir and os.path.isfile(os.path.join(working_directory, args.load_dir)):
        raise ArgumentError(
            f"DefaultCheckpointerArguments.load_dir is the folder of the checkpoints, not the file {args.load_dir!r}: "
            "give its folder as load_dir and its name as load_filename"
        )
    if isinstance(args.period, bool | np.bool_) or not isinstance(args.period, numbers.Integral) or args.period <= 0:
        raise ArgumentError(f"DefaultCheckpointerArguments.period must be a positive integer, not {args.period!r}")
    level = args.log_level
    if isinstance(level, bool) or not (isinstance(level, int) or str(level).upper() in logging.getLevelNamesMapping()):
        raise ArgumentError(
            f"DefaultCheckpointerArguments.log_level must be one of {sorted(logging.getLevelNamesMapping())}, "
            f"not {args.log_level!r}"
        )
    if args.load_filename and not args.load_dir:
        raise ArgumentError(
            f"DefaultCheckpointerArguments.load_filename={args.load_filename!r} needs load_dir, the folder it is in"
        )
