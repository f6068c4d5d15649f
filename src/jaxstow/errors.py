"""Every error jaxstow raises on purpose.

Each message names the file (when there is one), the leaf path inside the tree and what was expected, so that a
failure can be acted on without a debugger.

>>> import jaxstow
>>> try:
...     jaxstow.save("never-written.jxs", {"act": lambda x: x})
... except jaxstow.errors.UnsaveableObjectError as error:
...     print(error)
cannot save leaf 'act' of never-written.jxs: <function <lambda> ...> is neither data nor registered; register it with jaxstow.saveable(obj, name=...)
"""

from __future__ import annotations

import io
import re
import reprlib
import socket
import types
from collections.abc import Callable, Iterator, Sequence

__all__ = [
    "ArgumentError",
    "CheckpointError",
    "CheckpointStorageError",
    "ClosedError",
    "CollectorError",
    "CollectorStorageError",
    "CorruptFileError",
    "DeviceTransferError",
    "FormatError",
    "IsAFolderError",
    "JaxstowError",
    "LeafNotFoundError",
    "MetadataError",
    "MissingDependencyError",
    "NewerFormatError",
    "NotAFolderError",
    "PathError",
    "PathNotFoundError",
    "RefusedNameError",
    "RequestError",
    "SampleCountError",
    "SelectionError",
    "ShardingError",
    "SliceError",
    "StepNotFoundError",
    "StorageError",
    "StructureMismatchError",
    "TruncatedFileError",
    "UnknownNameError",
    "UnsaveableObjectError",
    "VariableMismatchError",
    "excerpt",
    "failed",
]


def excerpt(value: object, limit: int = 100) -> str:
    """Quote ``value`` in at most ``limit`` characters, as an error quotes what it read from a file.

    Containers are shown three levels and four items deep and long strings and numbers are cut in the middle, so a
    value nested thousands of levels deep, or huge, quotes in one line.

    Args:
        value: any object, even one whose ``repr`` fails.
        limit: the most characters returned.

    Returns:
        A ``repr`` of ``value``, shortened.

    >>> from jaxstow.errors import excerpt
    >>> deep = []
    >>> for _ in range(5000):
    ...     deep = [deep]
    >>> excerpt(deep), excerpt({"a": 1, "b": [1, 2, 3, 4, 5, 6]}), excerpt("x" * 1000, limit=20)
    ('[[[[...]]]]', "{'a': 1, 'b': [1, 2, 3, 4, ...]}", "'xxxxxxx...xxxxxxxx'")
    """
    shown = reprlib.Repr()
    shown.maxlevel, shown.maxdict, shown.maxlist, shown.maxtuple, shown.maxset = 3, 4, 4, 4, 4
    shown.maxstring = shown.maxlong = shown.maxother = limit
    try:
        text = shown.repr(value)
    except Exception:  # a repr that fails (an integer of too many digits, an object's own __repr__)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(file: str | None, path: str | None) -> str:
    parts = []
    if path is not None:
        parts.append(f"leaf {excerpt(path, 200)}" if path else "the root of the tree")
    if file is not None:
        parts.append(f"{'of ' if parts else ''}{file}")
    return " ".join(parts)


class JaxstowError(Exception):
    """Base class of jaxstow's errors; ``file`` and ``path`` say where the problem is."""

    def __init__(self, message: str, *, file: str | None = None, path: str | None = None) -> None:
        super().__init__(_without_passwords(message))  # a URL's password never reaches a message, nor a log
        self.file = None if file is None else _without_passwords(file)
        self.path = path


#: The password of a URL's ``user:password@``.
_URL_PASSWORD = re.compile(r"(://[^/\s:@]*):[^@\s/]*@")


def _without_passwords(text: str) -> str:
    """``text`` with the password of every URL in it masked.

    >>> _without_passwords("http://me:hunter2@host/m.jxs: no such file")
    'http://me:***@host/m.jxs: no such file'
    >>> error = PathNotFoundError("no such file", file="https://me:hunter2@host/m.jxs")
    >>> str(error), error.file, error.filename
    ('https://me:***@host/m.jxs: no such file', 'https://me:***@host/m.jxs', 'https://me:***@host/m.jxs')
    """
    return _URL_PASSWORD.sub(r"\1:***@", text) if "@" in text else text


class FormatError(JaxstowError, ValueError):
    """A file is not a valid jaxstow, safetensors or npz file, or its header contradicts itself."""

    def __init__(self, problem: str, *, file: str | None = None, path: str | None = None) -> None:
        where = _where(file, path)
        super().__init__(f"{where}: {problem}" if where else problem, file=file, path=path)


class NewerFormatError(FormatError):
    """A file written by a newer jaxstow, in a format version this one does not read: upgrade jaxstow."""


class ArgumentError(JaxstowError, ValueError, TypeError):
    """An argument jaxstow cannot use: of the wrong type, out of range, or at odds with the other arguments.

    The message names the argument, says what it takes and, where one helps, the call that works. Also a
    ``ValueError`` and a ``TypeError``, which code written against the builtins may catch.
    """


class MetadataError(JaxstowError, TypeError):
    """Metadata that strict JSON cannot hold unchanged (NaN, numpy scalars, sets, ...); the message names the key."""


class PathError(JaxstowError, OSError):
    """A path cannot be used as asked: a folder where a file is expected, a missing file or folder."""

    def __init__(self, problem: str, *, file: str) -> None:
        super().__init__(f"{file}: {problem}", file=file)
        self.filename = self.file

    def __str__(self) -> str:  # OSError would format its arguments otherwise
        return str(self.args[0])


class PathNotFoundError(PathError, FileNotFoundError):
    """A file or folder that does not exist (also a ``FileNotFoundError``)."""


class IsAFolderError(PathError, IsADirectoryError):
    """A folder where a file is expected (also an ``IsADirectoryError``)."""


class NotAFolderError(PathError, NotADirectoryError):
    """A file where a folder is expected (also a ``NotADirectoryError``)."""


class StorageError(JaxstowError, OSError):
    """The storage behind a path or URL failed or refused: a full disk, a read-only folder, no permission, an I/O
    error, missing credentials, a server out of reach.

    The message names the path or URL being written or read (never a temporary name) and the cause in words; the
    storage's own exception is the cause. Also an ``OSError``, whose ``errno`` (``errno.ENOSPC``, ...) and
    ``filename`` (the path or URL) are set, so code that catches ``OSError`` keeps working.
    """

    def __init__(self, problem: str, *, file: str, errno: int | None = None) -> None:
        super().__init__(f"{file}: {problem}", file=file)
        self.errno = errno
        self.strerror = problem
        self.filename = self.file

    def __str__(self) -> str:  # OSError would format its arguments otherwise
        return str(self.args[0])


class MissingDependencyError(JaxstowError, ImportError):
    """A feature needs an optional package that is not installed; the message names the extra that installs it."""

    def __str__(self) -> str:  # ImportError would show only its name otherwise
        return str(self.args[0])


class ClosedError(JaxstowError, ValueError):
    """A reader used after ``close()`` (or after its ``with`` block).

    The message names the file and says to open it again. Also a ``ValueError``, as Python's own files raise.
    """

    def __init__(self, what: str, *, file: str) -> None:
        super().__init__(f"{file}: {what} after the reader was closed; open the file again to read it", file=file)


class CorruptFileError(FormatError):
    """A leaf's bytes do not match the checksum recorded when it was written."""


class TruncatedFileError(CorruptFileError):
    """A file ends before the data its header promises."""


class UnsaveableObjectError(JaxstowError, TypeError):
    """A leaf is neither data nor an object registered with :func:`jaxstow.saveable`."""

    def __init__(self, obj: object, *, file: str | None = None, path: str = "", advice: str | None = None) -> None:
        super().__init__(
            f"cannot save {_where(file or None, path)}: {excerpt(obj)} is {advice or _unsaveable_advice(obj)}",
            file=file,
            path=path,
        )
        self.obj = obj

    @staticmethod
    def advises_registering(obj: object) -> bool:
        """Whether the advice for ``obj``, unless a caller gives another, is to register it."""
        return _unsaveable_advice(obj) == _REGISTER


_REGISTER = "neither data nor registered; register it with jaxstow.saveable(obj, name=...)"


def _unsaveable_advice(obj: object) -> str:
    """What to do about an object that is neither data nor registered: register it only where that helps."""
    if isinstance(obj, set | frozenset):
        return "a set, which has no order to save: save sorted(...) or list(...) of it instead"
    if isinstance(obj, io.IOBase | socket.socket | types.ModuleType) or type(obj).__module__ == "_thread":
        return "a resource of this process (an open file, a lock, a module), which cannot be saved: save its name or contents"
    if isinstance(obj, types.GeneratorType | types.AsyncGeneratorType | types.CoroutineType) or (
        isinstance(obj, Iterator) and not callable(obj)
    ):
        return "an iterator, whose values are not there to save: save list(...) of it instead"
    if isinstance(obj, bytearray | memoryview):
        return "a mutable buffer: save bytes(...) of it instead"
    return _REGISTER


class UnknownNameError(JaxstowError, LookupError):
    """A file names an object that is not registered in this process, so it cannot be rebuilt.

    ``libraries`` are the modules, sorted, that the file names objects of and this process has not imported (such as
    ``equinox``, or ``flax.nnx``, which ``import flax`` leaves out); empty when that is not the problem. The advice
    then says to import them all.
    """

    def __init__(
        self,
        name: str,
        *,
        file: str | None = None,
        path: str | None = None,
        advice: str = "",
        libraries: Sequence[str] = (),
    ) -> None:
        where = _where(file, path)
        advice = advice or f"register it with jaxstow.saveable(obj, name={name!r}) before loading"
        super().__init__(
            f"{where + ': ' if where else ''}the file names {excerpt(name)}, which is not registered in this process; {advice}",
            file=file,
            path=path,
        )
        self.name = name
        self.libraries = tuple(libraries)

    def __str__(self) -> str:  # LookupError would quote the message otherwise
        return str(self.args[0])


class RefusedNameError(UnknownNameError):
    """A file names an object that jaxstow's name policy never rebuilds (I/O, code execution, allocation on request)."""

    def __init__(self, name: str, reason: str, *, file: str | None = None, path: str | None = None) -> None:
        where = _where(file, path)
        JaxstowError.__init__(
            self,
            f"{where + ': ' if where else ''}the file names {excerpt(name)}, which jaxstow's name policy refuses: {reason}",
            file=file,
            path=path,
        )
        self.name = name
        self.reason = reason
        self.libraries = ()


class StructureMismatchError(JaxstowError, ValueError):
    """Loading into a ``like`` tree failed; ``problems`` lists every mismatch, one per leaf path, and ``fix`` (a
    sentence after them) how to load it."""

    def __init__(self, problems: Sequence[str], *, file: str | None = None, fix: str | None = None) -> None:
        lines = "\n".join(f"  - {problem}" for problem in problems) + (f"\n{fix}" if fix else "")
        super().__init__(
            f"{file or 'the source'} does not fit the given structure ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}):\n{lines}",
            file=file,
        )
        self.problems = list(problems)


class VariableMismatchError(StructureMismatchError, AssertionError):
    """Loading into Objax variables failed: a variable has no stored value, or one of another shape or dtype.

    Also an ``AssertionError``, which Objax raises when a value does not fit its variable.
    """


class RequestError(JaxstowError, ValueError):
    """A restore asked for something the file cannot give: a slice out of bounds, a pattern matching nothing, ..."""

    def __init__(self, problem: str, *, file: str | None = None, path: str | None = None) -> None:
        where = _where(file, path)
        super().__init__(f"{where}: {problem}" if where else problem, file=file, path=path)


class SliceError(RequestError, IndexError):
    """An index does not select a part of a stored array (out of bounds, or not made of integers and slices)."""


class SelectionError(RequestError, LookupError):
    """A ``select`` pattern matches no leaf of the file."""

    def __str__(self) -> str:  # LookupError would quote the message otherwise
        return str(self.args[0])


class LeafNotFoundError(RequestError, KeyError):
    """A file holds no leaf at the path asked for; also a ``KeyError``, as a reader is a mapping of paths to leaves
    (``reader.get(path)`` gives ``None``)."""

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return str(self.args[0])


class ShardingError(RequestError):
    """A sharded leaf cannot be saved or placed as asked.

    A shape that does not divide, devices that are missing, an array spanning several processes given to a one-file
    save.
    """


class CheckpointError(JaxstowError):
    """A checkpoint directory cannot be used as asked (missing step, existing step, held lock, ...)."""


class StepNotFoundError(CheckpointError, LookupError):
    """A step that is not in a checkpoint directory.

    Never saved, or deleted (also by the keep policy of the process that saves there, while it was being read). The
    message names the directory and the steps it holds.
    """


class CollectorError(JaxstowError, RuntimeError):
    """A data collector failed during a run (disk full, closed file, ...); the collector's exception is the cause."""


class CheckpointStorageError(CheckpointError, StorageError):
    """A checkpoint's write failed in its storage (a full disk, a read-only folder): also a :class:`StorageError`,
    with the ``errno`` and ``filename`` of its cause."""

    def __init__(self, message: str, *, cause: StorageError) -> None:
        _carry(self, message, cause)


class CollectorStorageError(CollectorError, StorageError):
    """A data collector's write failed in its storage (a full disk, a read-only folder): also a
    :class:`StorageError`, with the ``errno`` and ``filename`` of its cause."""

    def __init__(self, message: str, *, cause: StorageError) -> None:
        _carry(self, message, cause)


def _carry(error: StorageError, message: str, cause: StorageError) -> None:
    JaxstowError.__init__(error, message, file=cause.file)
    error.errno, error.strerror, error.filename = cause.errno, cause.strerror, cause.filename


_STORAGE_KINDS: dict[type[JaxstowError], Callable[..., JaxstowError]] = {
    CheckpointError: CheckpointStorageError,
    CollectorError: CollectorStorageError,
}


def failed(kind: type[CheckpointError] | type[CollectorError], message: str, cause: BaseException) -> JaxstowError:
    """An error of ``kind`` saying ``message`` about ``cause``: a storage failure stays a :class:`StorageError`.

    Raise it ``from cause``. A :class:`StorageError` cause gives a :class:`CheckpointStorageError` or a
    :class:`CollectorStorageError`, so that ``except StorageError`` (and ``except OSError``) catch it too.

    >>> from jaxstow.errors import CheckpointError, StorageError, failed
    >>> full = StorageError("cannot write it: no space left on the device holding /run", file="/run/1/a", errno=28)
    >>> error = failed(CheckpointError, f"saving step 1 failed: {full}", full)
    >>> isinstance(error, CheckpointError), isinstance(error, StorageError), error.errno, error.filename
    (True, True, 28, '/run/1/a')
    >>> type(failed(CheckpointError, "saving step 1 failed", ValueError("bad"))).__name__
    'CheckpointError'
    """
    if isinstance(cause, StorageError) and kind in _STORAGE_KINDS:
        return _STORAGE_KINDS[kind](message, cause=cause)
    return kind(message)


class SampleCountError(JaxstowError, ValueError):
    """Chains kept more samples than ``static_information.samples_collected`` declared.

    ``overflows`` lists ``(chain, kept, declared)``; ``advice`` says what became of the extra samples and what to do.

    >>> print(SampleCountError([(0, 7, 5)], "declare the right number"))
    chain 0 kept 7 samples, but static_information declared samples_collected=5; declare the right number
    """

    def __init__(self, overflows: Sequence[tuple[int, int, int]], advice: str) -> None:
        chains = "; ".join(
            f"chain {chain} kept {kept} samples, but static_information declared samples_collected={declared}"
            for chain, kept, declared in overflows
        )
        super().__init__(f"{chains}; {advice}")
        self.overflows = list(overflows)


class DeviceTransferError(JaxstowError, RuntimeError):
    """A restored array could not be moved to its device (out of device memory, a device lost); the leaf is named."""
